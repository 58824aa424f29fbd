"""The X.509 delegations an ARC REST client (agents.ce.arcrest) keeps on the REAL local A-REX
of tools/arc-localhost: one per identity whatever the number of clients (agent processes),
found again on the CE by a new client, renewed by time without a submission, and the stale
ones (expired, never completed, superseded) removed; and a token for another audience refused
before it is sent.

Skipped locally when A-REX cannot start; failing where CI or GRIDPILOT_TEST_REQUIRE_SERVERS=1
is set (tests/integration/arc.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography import x509

from agents.ce.arcrest import WLCG_ANY_AUDIENCE, ArcAuthError, ArcRestClient
from agents.ce.x509proxy import (
    Credential,
    load_credential,
    make_proxy,
    sign_proxy_request,
)
from tests.integration.arc import LocalCe, clear_delegations, local_ce, write_secret


@pytest.fixture(scope="session")
def arc_ce() -> LocalCe:
    return local_ce()


def _user(arc_ce: LocalCe) -> Credential:
    return load_credential(arc_ce.user_cert, arc_ce.user_key)


def _proxy_file(path: Path, user: Credential, lifetime: timedelta) -> Path:
    path.write_bytes(make_proxy(user, lifetime=lifetime))
    path.chmod(0o600)
    return path


def _raw(arc_ce: LocalCe, method: str, path: str, **kwargs: Any) -> requests.Response:
    """A request of the test's own, with the CE's test user's proxy (its identity)."""
    headers = {"Accept": "application/json", **kwargs.pop("headers", {})}
    return requests.request(method, f"{arc_ce.endpoint}/rest/1.0/{path}",
                            cert=str(arc_ce.proxy), verify=str(arc_ce.ca_bundle), timeout=30,
                            headers=headers, **kwargs)


def _held(arc_ce: LocalCe) -> list[str]:
    """The ids of the delegations the CE holds for the test user."""
    response = _raw(arc_ce, "GET", "delegations")
    assert response.status_code == 200, response.reason
    if not response.content.strip():
        return []
    listed = response.json()["delegation"]
    return [d["id"] for d in (listed if isinstance(listed, list) else [listed])]


def _certificate(arc_ce: LocalCe, delegation: str) -> x509.Certificate:
    response = _raw(arc_ce, "POST", f"delegations/{delegation}", params={"action": "get"})
    assert response.status_code == 200, response.reason
    return x509.load_pem_x509_certificates(response.content)[0]


def _made(arc_ce: LocalCe, proxy: Path) -> str:
    """A delegation made as a process of old made one (no look at what the CE holds), signed
    with ``proxy``: it ends with it."""
    asked = _raw(arc_ce, "POST", "delegations", params={"action": "new"})
    assert asked.status_code == 201, asked.reason
    delegation = asked.headers["Location"].rstrip("/").rsplit("/", 1)[-1]
    chain = sign_proxy_request(asked.content, load_credential(proxy), lifetime=timedelta(days=1),
                               now=datetime.now(UTC))
    put = _raw(arc_ce, "PUT", f"delegations/{delegation}", data=chain,
               headers={"Content-Type": "application/x-pem-file"})
    assert put.status_code in (200, 201, 204), put.reason
    return delegation


def count_requests(client: ArcRestClient) -> list[str]:
    seen: list[str] = []

    def hook(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        seen.append(f"{response.request.method} {response.request.url}")

    client._session.hooks["response"].append(hook)
    return seen


@pytest.fixture()
def no_delegations(arc_ce: LocalCe) -> Iterator[None]:
    """The test user starts (and ends) with no delegation on the CE."""
    clear_delegations(arc_ce)
    assert _held(arc_ce) == []
    yield
    clear_delegations(arc_ce)


# -- one delegation per identity ------------------------------------------------------------------

def test_two_clients_of_one_proxy_end_up_with_one_delegation(
        arc_ce: LocalCe, no_delegations: None) -> None:
    first = arc_ce.proxy_client()
    made = first.delegation()
    assert made is not None and _held(arc_ce) == [made]
    # Another agent process, the same proxy: it finds the delegation on the CE and uses it.
    second = arc_ce.proxy_client()
    assert second.delegation() == made
    assert second.keep_delegation() == made
    assert _held(arc_ce) == [made]


def test_a_new_client_adopts_the_best_delegation_and_removes_the_stale_ones(
        arc_ce: LocalCe, no_delegations: None, tmp_path: Path) -> None:
    user = _user(arc_ce)
    # What processes that came and went left: a delegation that expired, one never completed
    # (made, never signed), and two valid ones, of which the later-ending one is kept.
    _made(arc_ce, _proxy_file(tmp_path / "brief.pem", user, timedelta(seconds=2)))
    incomplete = _raw(arc_ce, "POST", "delegations", params={"action": "new"})
    assert incomplete.status_code == 201
    _made(arc_ce, _proxy_file(tmp_path / "short.pem", user, timedelta(hours=6)))
    longer = _made(arc_ce, _proxy_file(tmp_path / "long.pem", user, timedelta(hours=12)))
    assert len(_held(arc_ce)) == 4
    time.sleep(3)  # the first one's proxy has ended, and so has its delegation

    client = arc_ce.proxy_client()
    assert client.keep_delegation() == longer
    assert _held(arc_ce) == [longer]
    # Its end was read on the CE: far from it, nothing more is asked.
    seen = count_requests(client)
    assert client.keep_delegation() == longer
    assert seen == []


# -- renewed by time ------------------------------------------------------------------------------

def test_a_delegation_far_from_its_end_is_kept_without_a_request(
        arc_ce: LocalCe, no_delegations: None, tmp_path: Path) -> None:
    proxy = _proxy_file(tmp_path / "proxy.pem", _user(arc_ce), timedelta(hours=24))
    client = arc_ce.proxy_client(proxy)
    delegation = client.keep_delegation()
    assert delegation is not None
    seen = count_requests(client)
    assert client.keep_delegation() == delegation
    assert seen == []


def test_a_delegation_near_its_end_is_renewed_without_a_submission(
        arc_ce: LocalCe, no_delegations: None, tmp_path: Path) -> None:
    # A proxy of half an hour: its delegation never has more than the hour before its end
    # that RENEW_BEFORE asks for, so it is due for renewal whenever it is kept.
    proxy = _proxy_file(tmp_path / "proxy.pem", _user(arc_ce), timedelta(minutes=30))
    client = arc_ce.proxy_client(proxy)
    delegation = client.keep_delegation()
    assert delegation is not None
    first = _certificate(arc_ce, delegation)
    seen = count_requests(client)
    assert client.keep_delegation() == delegation
    second = _certificate(arc_ce, delegation)
    assert second.serial_number != first.serial_number
    assert not any("/jobs" in request for request in seen)  # no job was submitted
    # Another process adopts it, reads on the CE how near its end is, and renews it at once.
    other = arc_ce.proxy_client(proxy)
    assert other.keep_delegation() == delegation
    assert _certificate(arc_ce, delegation).serial_number != second.serial_number
    assert _held(arc_ce) == [delegation]


def test_a_token_client_keeps_no_delegation(arc_ce: LocalCe, tmp_path: Path) -> None:
    client = arc_ce.token_client(write_secret(tmp_path / "ce.token", arc_ce.token()))
    seen = count_requests(client)
    assert client.keep_delegation() is None
    assert seen == []


# -- a token's audience ---------------------------------------------------------------------------

def test_a_token_for_another_audience_is_refused_before_it_is_sent(arc_ce: LocalCe,
                                                                  tmp_path: Path) -> None:
    other = "https://ce.example.org:8443/arex"
    path = write_secret(tmp_path / "wrong.token", arc_ce.token(audience=other))
    client = arc_ce.token_client(path)
    seen = count_requests(client)
    with pytest.raises(ArcAuthError) as err:
        client.statuses(None)
    message = str(err.value)
    assert other in message and arc_ce.endpoint in message and str(path) in message
    assert err.value.credential == path and not err.value.retryable
    assert seen == []


@pytest.mark.parametrize("audience", ["endpoint", "list", "any"])
def test_a_token_naming_the_endpoint_among_its_audiences_is_sent(
        arc_ce: LocalCe, tmp_path: Path, audience: str) -> None:
    claims: dict[str, Any] = {
        "endpoint": {"audience": arc_ce.endpoint},
        "list": {"aud": ["https://ce.example.org/arex", arc_ce.endpoint]},
        "any": {"aud": [WLCG_ANY_AUDIENCE, arc_ce.endpoint]},
    }[audience]
    path = write_secret(tmp_path / "ce.token", arc_ce.token(**claims))
    client = arc_ce.token_client(path)
    seen = count_requests(client)
    if audience == "endpoint":
        assert isinstance(client.statuses(None), dict)
        return
    # Sent: the CE decides. (A-REX 6.17 refuses an 'aud' that is a list, even one naming it.)
    with pytest.raises(ArcAuthError) as err:
        client.statuses(None)
    assert err.value.status == 403 and seen


def test_the_ces_refusal_to_map_a_token_names_its_likely_causes(arc_ce: LocalCe,
                                                                tmp_path: Path) -> None:
    path = write_secret(tmp_path / "stranger.token", arc_ce.token(iss="https://localhost:9/"))
    client = arc_ce.token_client(path)
    with pytest.raises(ArcAuthError) as err:
        client.statuses(None)
    message = str(err.value)
    assert err.value.status == 403 and "User can't be assigned configuration" in message
    for cause in ("audience", "issuer", "authgroup"):
        assert cause in message
