"""What the ARC REST client refuses before it sends anything (agents.ce.arcrest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.ce.arcrest import WLCG_ANY_AUDIENCE, ArcRestClient, audience_accepted


def test_a_client_needs_an_https_endpoint_and_one_credential(tmp_path: Path) -> None:
    token = tmp_path / "token"
    with pytest.raises(ValueError, match="exactly one"):
        ArcRestClient("https://ce.example.org/arex")
    with pytest.raises(ValueError, match="exactly one"):
        ArcRestClient("https://ce.example.org/arex", token_file=token, proxy_file=token)
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
