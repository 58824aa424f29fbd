"""What the ARC REST client refuses before it sends anything (agents.ce.arcrest)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from agents.ce.arcrest import (
    WLCG_ANY_AUDIENCE,
    ArcAuthError,
    ArcRestClient,
    audience_accepted,
    token_near_end,
)


def _jwt(claims: dict[str, object]) -> str:
    """An unsigned JWT carrying ``claims`` (the client reads claims without verifying)."""
    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")
    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


@pytest.mark.parametrize(("iat", "exp", "now", "near"), [
    (0, 3600, 3000, False),     # 600 s of 3600 s left: 17 %, over 5 min
    (0, 3600, 3301, True),      # 299 s left: under 5 min
    (0, 86400, 78000, True),    # 8400 s of a day left: under 10 %
    (0, 86400, 77000, False),   # 9400 s left: 10.9 %
    (None, 3600, 3400, True),   # no iat: the 5 minutes alone
    (None, 3600, 3000, False),
    (0, 3600, 3600, False),     # expired: refused before a request, not warned
])
def test_a_token_near_its_end_is_told_by_its_claims(iat: int | None, exp: int, now: int,
                                                    near: bool) -> None:
    claims: dict[str, object] = {"exp": exp, **({"iat": iat} if iat is not None else {})}
    assert bool(token_near_end(_jwt(claims), now)) == near


def test_the_client_warns_of_a_token_near_its_end_until_its_file_is_replaced(
        tmp_path: Path) -> None:
    now = [1000.0]
    token = tmp_path / "token"
    token.write_text(_jwt({"iat": 0, "exp": 1200}))  # 200 s of 1200 s left
    client = ArcRestClient("https://ce.example.org/arex", token_file=token,
                           clock=lambda: now[0])
    warning = client.credential_warning()
    assert warning.startswith(f"the token in {token} is near its end: it expires at ")
    assert "200 s of its 1200 s left" in warning
    token.write_text(_jwt({"iat": 1000, "exp": 4600}) + "\n")  # a refresher replaced it
    assert client.credential_warning() == ""
    # An expired token fails before any request (the CE's name does not even resolve).
    now[0] = 4600.0
    with pytest.raises(ArcAuthError, match=r"expired at .*its file was not replaced"):
        client.statuses(["job"])


def test_a_client_needs_an_https_endpoint_and_a_credential(tmp_path: Path) -> None:
    token, proxy = tmp_path / "token", tmp_path / "proxy"
    with pytest.raises(ValueError, match="a token_file, a proxy_file or both"):
        ArcRestClient("https://ce.example.org/arex")
    modes = {ArcRestClient("https://ce.example.org/arex", **files).credentials  # type: ignore[arg-type]
             for files in ({"token_file": token}, {"proxy_file": proxy},
                           {"token_file": token, "proxy_file": proxy})}
    assert modes == {"token", "proxy", "both"}
    for endpoint in ("http://ce.example.org/arex", "ce.example.org", "https:///arex"):
        with pytest.raises(ValueError, match="https URL"):
            ArcRestClient(endpoint, token_file=token)


def test_an_endpoint_without_a_path_is_the_ces_arex(tmp_path: Path) -> None:
    token = tmp_path / "token"
    assert ArcRestClient("https://ce.example.org:8443", token_file=token).endpoint == \
        "https://ce.example.org:8443/arex"
    assert ArcRestClient("https://ce.example.org/arex/", token_file=token).endpoint == \
        "https://ce.example.org/arex"


def test_only_the_files_arex_keeps_about_a_job_are_asked_for(tmp_path: Path) -> None:
    client = ArcRestClient("https://ce.example.org/arex", token_file=tmp_path / "token")
    with pytest.raises(ValueError, match="keeps no"):
        client.diagnose("job", "../../etc/passwd")
    with pytest.raises(ValueError, match="at least one byte"):
        client.download("job", "pilot.out", limit=0)


def test_the_audiences_a_token_for_a_ce_may_name() -> None:
    endpoint = "https://ce.example.org:8443/arex"
    for named in (endpoint, f"{endpoint}/", "https://ce.example.org:8443", "ce.example.org:8443",
                  "ce.example.org", WLCG_ANY_AUDIENCE):
        assert audience_accepted([named], endpoint), named
        assert audience_accepted(["https://other.example.org/arex", named], endpoint), named
    for other in ("https://ce.example.org/arex", "https://other.example.org:8443/arex",
                  "https://ce.example.org:8443/other", "other.example.org", ""):
        assert not audience_accepted([other], endpoint), other
    assert not audience_accepted([], endpoint)
    # A token without 'aud' is left for the CE to judge.
    assert audience_accepted(None, endpoint)
    # On the default port the origin may leave it out.
    assert audience_accepted(["https://ce.example.org"], "https://ce.example.org/arex")
    assert audience_accepted(["https://ce.example.org:443/arex"], "https://ce.example.org/arex")
