"""The service and the agents, started with the placeholders of
deploy/systemd/gridpilot.env.example, refuse to start: one line saying which setting is a
placeholder and how to make a real secret, no traceback, and nothing listens."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gridpilot.devserver import free_port
from taskqueue.core.settings import MAKE_SECRET
from tests.unit.test_secret_strength import shipped_env

ROOT = Path(__file__).resolve().parents[2]


def _start(tmp_path: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    base = {key: value for key, value in os.environ.items()
            if not key.startswith("GRIDPILOT_")}
    full = {**base, "GRIDPILOT_DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}",
            "GRIDPILOT_RESOURCES_FILE": str(ROOT / "conf" / "resources.toml"),
            "GRIDPILOT_MATCHER_METRICS_DIR": str(tmp_path / "metrics")}
    if not (tmp_path / "g.db").exists():  # a database, so that only the secret is wrong
        made = subprocess.run([sys.executable, "-m", "gridpilot", "db", "upgrade"], env=full,
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr
    full.update(env)
    return subprocess.run([sys.executable, "-m", "gridpilot", *args], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("setting, env_name", [
    ("auth.secret", "GRIDPILOT_AUTH_SECRET"),
    ("matcher.metrics_token", "GRIDPILOT_MATCHER_METRICS_TOKEN"),
])
def test_serve_refuses_the_shipped_placeholders(tmp_path: Path, setting: str,
                                                 env_name: str) -> None:
    port = free_port()
    env = {"GRIDPILOT_AUTH_SECRET": secrets.token_urlsafe(32),
           env_name: shipped_env()[env_name]}
    out = _start(tmp_path, ["serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"], **env)
    assert out.returncode != 0
    assert setting in out.stderr and "placeholder" in out.stderr, out.stderr
    assert MAKE_SECRET in out.stderr and "Traceback" not in out.stderr
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # nothing listens


def test_agents_refuse_the_shipped_secret(tmp_path: Path) -> None:
    out = _start(tmp_path, ["agents", "--once"],
                 GRIDPILOT_AUTH_SECRET=shipped_env()["GRIDPILOT_AUTH_SECRET"])
    assert out.returncode != 0
    assert "auth.secret" in out.stderr and "placeholder" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_no_operator_token_is_made_with_a_weak_secret(tmp_path: Path) -> None:
    out = _start(tmp_path, ["token", "issue", "--role", "operator", "--subject", "mallory"],
                 GRIDPILOT_AUTH_SECRET="s" * 40)
    assert out.returncode != 0 and out.stdout == ""
    assert "too weak" in out.stderr and "Traceback" not in out.stderr
