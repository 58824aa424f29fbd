"""Secrets the service refuses: the placeholders it ships, and secrets of low entropy; a
secret made as the refusal says passes (docs/operations.md, "Secrets")."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from taskqueue.core.errors import ConfigurationError
from taskqueue.core.settings import (
    MAKE_SECRET,
    MIN_SECRET_BITS,
    AuthSettings,
    load_settings,
    secret_bits,
)

ROOT = Path(__file__).resolve().parents[2]
GOOD = secrets.token_urlsafe(32)


def shipped_env() -> dict[str, str]:
    """The settings deploy/systemd/gridpilot.env.example ships, as an operator copies them."""
    text = (ROOT / "deploy" / "systemd" / "gridpilot.env.example").read_text()
    pairs = (line.split("=", 1) for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def _refusal(env: dict[str, str]) -> str:
    with pytest.raises(ConfigurationError) as info:
        load_settings(None, env).auth.signing_secret()
    return str(info.value)


def test_the_shipped_auth_secret_is_refused() -> None:
    shipped = shipped_env()
    message = _refusal({"GRIDPILOT_AUTH_SECRET": shipped["GRIDPILOT_AUTH_SECRET"]})
    assert "auth.secret" in message and "placeholder" in message
    assert "GRIDPILOT_AUTH_SECRET" in message and MAKE_SECRET in message


def test_the_shipped_metrics_token_is_refused() -> None:
    shipped = shipped_env()
    message = _refusal({"GRIDPILOT_AUTH_SECRET": GOOD, "GRIDPILOT_MATCHER_METRICS_TOKEN":
                        shipped["GRIDPILOT_MATCHER_METRICS_TOKEN"]})
    assert "matcher.metrics_token" in message and "placeholder" in message
    assert "GRIDPILOT_MATCHER_METRICS_TOKEN" in message and MAKE_SECRET in message


def test_the_shipped_database_password_is_refused() -> None:
    shipped = shipped_env()
    message = _refusal({"GRIDPILOT_AUTH_SECRET": GOOD,
                        "GRIDPILOT_DATABASE_URL": shipped["GRIDPILOT_DATABASE_URL"]})
    assert "database.url" in message and "placeholder password" in message


@pytest.mark.parametrize("weak", [
    "s" * 40,                                    # one character repeated
    "passwordpasswordpasswordpassword",          # a word repeated
    "abababababababababababababababababababab",
    "0123456789" * 4,                            # a run repeated
    "Kx7#Kx7#Kx7#Kx7#Kx7#Kx7#Kx7#Kx7#Kx7#Kx7#",
    "changeme-changeme-changeme-changeme",
    "Replace_Me_With_A_Long_Random_Value_Please",
])
def test_weak_secrets_are_refused_everywhere(weak: str, tmp_path: Path) -> None:
    message = _refusal({"GRIDPILOT_AUTH_SECRET": weak})
    assert "auth.secret" in message and MAKE_SECRET in message
    message = _refusal({"GRIDPILOT_AUTH_SECRET": GOOD, "GRIDPILOT_MATCHER_METRICS_TOKEN": weak})
    assert "matcher.metrics_token" in message
    secret_file = tmp_path / "secret"
    secret_file.write_text(weak + "\n")
    with pytest.raises(ConfigurationError, match=f"auth.secret_file {secret_file}"):
        AuthSettings(secret_file=str(secret_file)).signing_secret()


def test_a_weak_secret_is_refused_with_its_figures() -> None:
    message = _refusal({"GRIDPILOT_AUTH_SECRET": "s" * 40})
    assert "too weak: 40 characters, about 0 bits" in message
    assert f"at least {MIN_SECRET_BITS}" in message


def test_secrets_made_as_the_message_says_pass() -> None:
    for _ in range(2000):
        made = secrets.token_urlsafe(32)
        assert load_settings(None, {"GRIDPILOT_AUTH_SECRET": made,
                                    "GRIDPILOT_MATCHER_METRICS_TOKEN": made}
                             ).auth.signing_secret() == made
    for _ in range(200):
        assert secret_bits(secrets.token_hex(32)) >= MIN_SECRET_BITS
