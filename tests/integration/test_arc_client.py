"""The ARC REST client (agents.ce.arcrest) against the REAL local A-REX of tools/arc-localhost:
jobs submitted with a token and with an X.509 proxy run through its fork back end, with an
input file uploaded into their session directories; bulk status, kill, clean, bounded
downloads; tokens and proxies the CE refuses; a CE that does not answer; a delegation the CE
lost; jobs it does not know.

Skipped locally when A-REX cannot start; failing where CI or GRIDPILOT_TEST_REQUIRE_SERVERS=1
is set (tests/integration/arc.py).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from agents.ce.adl import job_description
from agents.ce.arcrest import (
    FINAL_STATES,
    PILOT_STATUS,
    UNKNOWN,
    ArcAuthError,
    ArcRefused,
    ArcRestClient,
    ArcUnknownJob,
    ArcUnreachable,
    pilot_status,
)
from agents.ce.bundle import BUNDLE_FILE, pilot_bundle
from agents.ce.x509proxy import Credential, load_credential, make_proxy
from tests.integration.arc import (
    COMPUTE_SCOPES,
    LocalCe,
    clear_delegations,
    end_jobs,
    local_ce,
    wait_for_states,
    write_secret,
)

QUEUE = "fork"
#: A pilot's token, as the director would upload it: it must reach the session directory and
#: never the description.
SECRET = "eyJ.pilot-token-for-the-test.sig"


@pytest.fixture(scope="session")
def arc_ce() -> LocalCe:
    return local_ce()


@pytest.fixture()
def token_file(arc_ce: LocalCe, tmp_path: Path) -> Path:
    return write_secret(tmp_path / "ce.token", arc_ce.token())


@pytest.fixture()
def client(arc_ce: LocalCe, token_file: Path) -> Iterator[ArcRestClient]:
    c = arc_ce.token_client(token_file, timeout=30)
    yield c
    c.close()


def count_requests(client: ArcRestClient) -> list[str]:
    """The requests the client sends from now on (a response hook of its real session)."""
    seen: list[str] = []

    def hook(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        seen.append(f"{response.request.method} {response.request.url}")

    client._session.hooks["response"].append(hook)
    return seen


def sleeper(seconds: int = 600) -> str:
    return job_description("/bin/sh", ["-c", f"sleep {seconds}"], queue=QUEUE, wall_minutes=30)


def forget(client: ArcRestClient, ids: list[str]) -> None:
    """Kill and clean jobs a test leaves behind (best effort: they may have ended), and end
    what the CE's fork back end leaves of them."""
    end_jobs(local_ce(), client, ids)


# -- the CE ---------------------------------------------------------------------------------------

def test_info_names_the_ces_version_rest_versions_and_queue(client: ArcRestClient) -> None:
    info = client.info()
    assert info.version.startswith("6.")
    assert "1.0" in info.rest_versions
    assert QUEUE in info.queues
    assert client.rest_version() == "1.0"


# -- submissions ----------------------------------------------------------------------------------

def script_job(client: ArcRestClient, script: str, **inputs: bytes) -> str:
    """Submit ``/bin/sh job.sh`` with the script and the other input files uploaded (a
    script travels as a file: A-REX would expand "$" in a command line)."""
    [job] = client.submit([job_description("/bin/sh", ["job.sh"], queue=QUEUE, wall_minutes=10,
                                           memory_mb=256, input_files=["job.sh", *inputs])])
    assert isinstance(job, str), job
    for name, data in {"job.sh": script.encode(), **inputs}.items():
        client.upload(job, name, data)
    return job


def test_a_token_submits_a_job_whose_input_file_and_output_come_back(
        client: ArcRestClient) -> None:
    script = ('echo "running as $(id -un)"\necho "token: $(cat pilot.token)"\n'
              'i=0; while [ $i -lt 2000 ]; do echo "line $i of the pilot log"; i=$((i+1)); '
              'done\necho "the end" >&2\n')
    job = script_job(client, script, **{"pilot.token": SECRET.encode()})
    states = wait_for_states(client, [job], lambda s: s in FINAL_STATES)
    assert states[job] == "FINISHED"
    assert pilot_status(states[job]) == "Done"

    files = client.session_files(job)
    assert files["pilot.err"] == len(b"the end\n")
    out = client.download(job, "pilot.out")
    assert len(out) == files["pilot.out"]
    lines = out.decode().splitlines()
    assert lines[:2] == ["running as gridpilot-arc", f"token: {SECRET}"]
    assert lines[-1] == "line 1999 of the pilot log"
    # Bounded: the last bytes only, and exactly them.
    assert client.download(job, "pilot.out", limit=100) == out[-100:]
    assert client.download(job, "pilot.err") == b"the end\n"
    # The token travelled as a file: the CE's copy of the description never held it.
    description = client.diagnose(job, "description")
    assert "pilot.token" in description and SECRET not in description

    assert client.clean([job]) == {job: None}
    assert wait_for_states(client, [job], lambda s: s == UNKNOWN) == {job: UNKNOWN}


def test_a_proxy_submits_with_a_delegated_proxy_the_job_can_use(arc_ce: LocalCe) -> None:
    client = arc_ce.proxy_client()
    script = ('echo "keys: $(grep -c "BEGIN.*PRIVATE KEY" "$X509_USER_PROXY")"\n'
              'openssl x509 -in "$X509_USER_PROXY" -noout -issuer -nameopt compat\n'
              'cat input.txt\n')
    job = script_job(client, script, **{"input.txt": b"input of the proxy job\n"})
    delegation = client.delegation()
    assert delegation is not None and delegation in client.delegations()
    assert wait_for_states(client, [job], lambda s: s in FINAL_STATES)[job] == "FINISHED"

    lines = client.download(job, "pilot.out").decode().splitlines()
    subject = load_credential(arc_ce.proxy).certificate.subject
    dn = "".join(f"/{a.rfc4514_attribute_name}={a.value!s}" for rdn in subject.rdns
                 for a in rdn)
    # The job's proxy is the delegation: a key of its own, issued by the client's proxy.
    assert lines == ["keys: 1", f"issuer={dn}", "input of the proxy job"]
    client.clean([job])


def test_a_job_of_the_ce_runs_the_projects_pilot(arc_ce: LocalCe, client: ArcRestClient
                                                ) -> None:
    """What a pilot on this CE needs: the worker node's Python runs the pilot's bundle, an
    input file of the job as the director ships it, as the account jobs run as. Nothing of
    the checkout is read on the CE (it may sit in a folder that account cannot enter)."""
    [job] = client.submit([job_description(arc_ce.worker_python, [BUNDLE_FILE, "--help"],
                                           queue=QUEUE, wall_minutes=10,
                                           input_files=[BUNDLE_FILE])])
    assert isinstance(job, str), job
    client.upload(job, BUNDLE_FILE, pilot_bundle())
    assert wait_for_states(client, [job], lambda s: s in FINAL_STATES)[job] == "FINISHED"
    assert client.download(job, "pilot.out").startswith(b"usage: gridpilot-pilot")
    client.clean([job])


def test_one_request_answers_the_states_of_a_bulk_then_kill_ends_them(
        client: ArcRestClient) -> None:
    ids = client.submit([sleeper(), sleeper(), sleeper()])
    assert all(isinstance(j, str) for j in ids), ids
    jobs = [str(j) for j in ids]
    try:
        seen = count_requests(client)
        states = client.statuses([*jobs, "no-such-job"])
        assert len(seen) == 1
        assert states["no-such-job"] == UNKNOWN
        assert all(states[j] in PILOT_STATUS and states[j] != UNKNOWN for j in jobs)
        listing = client.statuses(None)
        assert len(seen) == 2
        assert set(jobs) <= set(listing)

        running = wait_for_states(client, jobs, lambda s: s == "RUNNING")
        assert {pilot_status(s) for s in running.values()} == {"Running"}
        assert client.kill(jobs) == dict.fromkeys(jobs)
        killed = wait_for_states(client, jobs, lambda s: s in FINAL_STATES)
        assert killed == dict.fromkeys(jobs, "KILLED")
        assert {pilot_status(s) for s in killed.values()} == {"Aborted"}
        assert "canceled" in client.diagnose(jobs[0], "failed")
    finally:
        forget(client, jobs)


def test_a_job_the_ce_refuses_does_not_spoil_the_rest_of_its_bulk(
        client: ArcRestClient) -> None:
    bad = job_description("/bin/true", queue="no-such-queue")
    refused, accepted = client.submit([bad, sleeper(5)])
    assert isinstance(refused, ArcRefused)
    assert "no-such-queue" in refused.reason and not refused.retryable
    assert isinstance(accepted, str)
    forget(client, [accepted])


def test_jobs_a_ce_does_not_know(arc_ce: LocalCe, client: ArcRestClient) -> None:
    assert client.statuses(["no-such-job"]) == {"no-such-job": UNKNOWN}
    assert pilot_status(UNKNOWN) == "Lost"
    for outcome in (client.kill(["no-such-job"]), client.clean(["no-such-job"])):
        assert isinstance(outcome["no-such-job"], ArcUnknownJob)
    calls: list[Callable[[], object]] = [lambda: client.download("no-such-job", "pilot.out"),
             lambda: client.upload("no-such-job", "pilot.token", b"x"),
             lambda: client.session_files("no-such-job"),
             lambda: client.diagnose("no-such-job")]
    for call in calls:
        with pytest.raises(ArcUnknownJob) as err:
            call()
        assert err.value.job_id == "no-such-job" and arc_ce.host_port in str(err.value)


def test_a_missing_file_of_a_known_job_is_not_an_unknown_job(client: ArcRestClient) -> None:
    [job] = client.submit([sleeper(5)])
    assert isinstance(job, str)
    try:
        with pytest.raises(ArcRefused) as err:
            client.download(job, "no-such-file")
        assert not isinstance(err.value, ArcUnknownJob) and err.value.status == 404
    finally:
        forget(client, [job])


# -- tokens ---------------------------------------------------------------------------------------

def test_an_expired_token_is_refused_before_it_is_sent(arc_ce: LocalCe, tmp_path: Path) -> None:
    path = write_secret(tmp_path / "old.token", arc_ce.token(lifetime=-60))
    client = arc_ce.token_client(path)
    seen = count_requests(client)
    with pytest.raises(ArcAuthError) as err:
        client.statuses(None)
    assert str(path) in str(err.value) and "expired" in str(err.value)
    assert err.value.credential == path and err.value.ce == arc_ce.host_port
    assert seen == []


def test_the_ce_refuses_a_token_that_expired_on_its_clock(arc_ce: LocalCe,
                                                          tmp_path: Path) -> None:
    path = write_secret(tmp_path / "short.token", arc_ce.token(lifetime=1))
    # A client whose clock is late still sends it; the CE checks for itself.
    client = arc_ce.token_client(path, clock=lambda: time.time() - 600)
    time.sleep(2)
    with pytest.raises(ArcAuthError) as err:
        client.statuses(None)
    assert err.value.status == 403 and err.value.credential == path
    assert str(path) in str(err.value) and err.value.reason


def _other_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


WRONG_TOKENS = {
    "signed by a key the issuer does not publish": {"key": "other"},
    "naming a key the issuer does not have": {"kid": "no-such-key", "key": "other"},
    "without compute.cancel": {"scope": "compute.read compute.create compute.modify"},
    "without compute.create": {"scope": "compute.read compute.modify compute.cancel"},
    "of an issuer the CE does not trust": {"iss": "https://localhost:9/"},
}


@pytest.mark.parametrize("changes", WRONG_TOKENS.values(), ids=WRONG_TOKENS.keys())
def test_a_wrong_token_is_refused_with_the_ce_and_the_file_named(
        arc_ce: LocalCe, tmp_path: Path, changes: dict[str, Any]) -> None:
    changes = dict(changes)
    if changes.get("key") == "other":
        changes["key"] = _other_key()
    path = write_secret(tmp_path / "wrong.token", arc_ce.token(**changes))
    client = arc_ce.token_client(path)
    with pytest.raises(ArcAuthError) as err:
        client.submit([sleeper(1)])
    assert err.value.status == 403 and not err.value.retryable
    assert f"{arc_ce.host_port} refused the token in {path}" in str(err.value)
    assert err.value.reason  # what the CE said


def test_a_token_file_is_read_again_when_it_changes(arc_ce: LocalCe, tmp_path: Path) -> None:
    path = write_secret(tmp_path / "ce.token", arc_ce.token(scope="compute.read"))
    client = arc_ce.token_client(path)
    with pytest.raises(ArcAuthError):
        client.statuses(None)
    write_secret(path, arc_ce.token(scope=COMPUTE_SCOPES))
    assert isinstance(client.statuses(None), dict)


def test_a_missing_or_empty_token_file_is_an_authentication_error(arc_ce: LocalCe,
                                                                  tmp_path: Path) -> None:
    missing = tmp_path / "missing.token"
    with pytest.raises(ArcAuthError, match="cannot read the credential file"):
        arc_ce.token_client(missing).statuses(None)
    empty = write_secret(tmp_path / "empty.token", "\n")
    with pytest.raises(ArcAuthError, match="is empty"):
        arc_ce.token_client(empty).statuses(None)


# -- proxies --------------------------------------------------------------------------------------

def _user_of_the_test_ca(arc_ce: LocalCe, name: str) -> Credential:
    """A user certificate the test CA signs, whose subject the CE does not allow."""
    ca_cert = x509.load_pem_x509_certificate((arc_ce.ca_bundle).read_bytes())
    ca_key = serialization.load_pem_private_key(
        arc_ce.ca_bundle.with_name(f"{arc_ce.ca_bundle.stem}-key.pem").read_bytes(),
        password=None)
    assert isinstance(ca_key, rsa.RSAPrivateKey)
    key = _other_key()
    now = datetime.now(UTC)
    subject = x509.Name([*ca_cert.subject.rdns[:-1], x509.RelativeDistinguishedName(
        [x509.NameAttribute(NameOID.COMMON_NAME, name)])])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=1)).not_valid_after(now + timedelta(days=1))
            .sign(ca_key, hashes.SHA256()))
    return Credential(cert, key, ())


def _proxy_file(path: Path, user: Credential, lifetime: timedelta) -> Path:
    path.write_bytes(make_proxy(user, lifetime=lifetime))
    path.chmod(0o600)
    return path


def _user(arc_ce: LocalCe) -> Credential:
    return load_credential(arc_ce.user_cert, arc_ce.user_key)


def test_an_expired_proxy_is_refused_before_it_is_sent(arc_ce: LocalCe, tmp_path: Path) -> None:
    path = _proxy_file(tmp_path / "proxy.pem", _user(arc_ce), timedelta(seconds=1))
    time.sleep(1.5)
    with pytest.raises(ArcAuthError) as err:
        arc_ce.proxy_client(path).statuses(None)
    assert str(path) in str(err.value) and "expired" in str(err.value)


def test_the_ce_refuses_a_proxy_of_a_user_it_does_not_allow(arc_ce: LocalCe,
                                                            tmp_path: Path) -> None:
    path = _proxy_file(tmp_path / "other.pem", _user_of_the_test_ca(arc_ce, "someone else"),
                       timedelta(hours=1))
    with pytest.raises(ArcAuthError) as err:
        arc_ce.proxy_client(path).statuses(None)
    assert err.value.status == 403 and f"refused the proxy in {path}" in str(err.value)


def test_the_ce_refuses_a_proxy_of_an_unknown_ca_in_the_handshake(arc_ce: LocalCe,
                                                                   tmp_path: Path) -> None:
    key = _other_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "self-made")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(7)
            .not_valid_before(now - timedelta(minutes=1)).not_valid_after(now + timedelta(days=1))
            .sign(key, hashes.SHA256()))
    path = _proxy_file(tmp_path / "rogue.pem", Credential(cert, key, ()), timedelta(hours=1))
    with pytest.raises(ArcAuthError) as err:
        arc_ce.proxy_client(path).statuses(None)
    assert "TLS handshake" in str(err.value) and err.value.credential == path


def test_a_ce_certificate_the_bundle_does_not_trust(arc_ce: LocalCe, tmp_path: Path) -> None:
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_bytes(_user_of_the_test_ca(arc_ce, "not a CA").certificate.public_bytes(
        serialization.Encoding.PEM))
    client = ArcRestClient(arc_ce.endpoint, token_file=arc_ce.token_file, ca_bundle=other_ca)
    with pytest.raises(ArcAuthError) as err:
        client.statuses(None)
    assert "not trusted by" in str(err.value) and err.value.credential == other_ca


# -- delegations ----------------------------------------------------------------------------------

def _delegated_certificate(arc_ce: LocalCe, proxy: Path, delegation: str) -> x509.Certificate:
    """The certificate the CE holds for a delegation (REST: action=get)."""
    response = requests.post(f"{arc_ce.endpoint}/rest/1.0/delegations/{delegation}",
                             params={"action": "get"}, cert=str(proxy),
                             verify=str(arc_ce.ca_bundle), timeout=30)
    assert response.status_code == 200, response.reason
    return x509.load_pem_x509_certificates(response.content)[0]


def test_a_delegation_is_renewed_before_it_ends_and_with_a_new_proxy(
        arc_ce: LocalCe, tmp_path: Path) -> None:
    user = _user(arc_ce)
    proxy = _proxy_file(tmp_path / "proxy.pem", user, timedelta(minutes=30))
    clear_delegations(arc_ce)  # a client takes one the CE holds for the user over a new one
    client = arc_ce.proxy_client(proxy)
    delegation = client.delegation()
    assert delegation is not None
    first = _delegated_certificate(arc_ce, proxy, delegation)
    assert first.not_valid_after_utc <= load_credential(proxy).not_after
    # Half an hour left is less than the hour before its end: renewed, same id.
    assert client.delegation() == delegation
    second = _delegated_certificate(arc_ce, proxy, delegation)
    assert second.serial_number != first.serial_number
    # A new proxy of a day: the delegation is renewed with it and lasts as long.
    _proxy_file(proxy, user, timedelta(hours=24))
    assert client.delegation() == delegation
    third = _delegated_certificate(arc_ce, proxy, delegation)
    assert third.not_valid_after_utc - datetime.now(UTC) > timedelta(hours=23)
    # Now far from its end: kept as it is.
    assert client.delegation() == delegation
    assert _delegated_certificate(arc_ce, proxy, delegation).serial_number == third.serial_number


def test_a_delegation_the_ce_lost_is_made_again_before_a_submission(arc_ce: LocalCe) -> None:
    clear_delegations(arc_ce)  # none that a job of another test still holds
    client = arc_ce.proxy_client()
    lost = client.delegation()
    assert lost is not None
    response = requests.post(f"{arc_ce.endpoint}/rest/1.0/delegations/{lost}",
                             params={"action": "delete"}, cert=str(arc_ce.proxy),
                             verify=str(arc_ce.ca_bundle), timeout=30)
    assert response.status_code == 202
    assert lost not in client.delegations()

    [job] = client.submit([sleeper(5)])
    assert isinstance(job, str)
    try:
        current = client.delegation()
        assert current is not None and current != lost
        assert current in client.delegations()
        # The job was submitted with the new delegation (REST: action=delegations).
        answer = requests.post(f"{arc_ce.endpoint}/rest/1.0/jobs",
                               params={"action": "delegations"}, json={"job": [{"id": job}]},
                               headers={"Accept": "application/json"}, cert=str(arc_ce.proxy),
                               verify=str(arc_ce.ca_bundle), timeout=30).json()
        assert answer["job"]["delegation_id"] == current
    finally:
        forget(client, [job])


def test_a_token_client_makes_no_delegation(client: ArcRestClient) -> None:
    assert client.delegation() is None


# -- a CE that does not answer --------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _token_for(arc_ce: LocalCe, tmp_path: Path, endpoint: str) -> Path:
    """A token whose audience is ``endpoint`` (the client refuses to send it elsewhere)."""
    return write_secret(tmp_path / "elsewhere.token", arc_ce.token(audience=endpoint))


def test_a_ce_that_is_down_is_unreachable_and_worth_retrying(arc_ce: LocalCe,
                                                             tmp_path: Path) -> None:
    endpoint = f"https://localhost:{_free_port()}/arex"
    client = ArcRestClient(endpoint, token_file=_token_for(arc_ce, tmp_path, endpoint),
                           ca_bundle=arc_ce.ca_bundle, timeout=5)
    with pytest.raises(ArcUnreachable) as err:
        client.submit([sleeper(1)])
    assert err.value.retryable and "no answer" in str(err.value)


def test_a_ce_that_hangs_times_out_as_unreachable(arc_ce: LocalCe, tmp_path: Path) -> None:
    # A listening socket that never answers: the TLS handshake waits until the timeout.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        endpoint = f"https://localhost:{server.getsockname()[1]}/arex"
        client = ArcRestClient(endpoint, token_file=_token_for(arc_ce, tmp_path, endpoint),
                               ca_bundle=arc_ce.ca_bundle, timeout=1)
        with pytest.raises(ArcUnreachable) as err:
            client.statuses(None)
        assert err.value.retryable


def test_a_url_that_is_no_arc_ce_is_refused_with_what_it_answered(arc_ce: LocalCe,
                                                                  tmp_path: Path) -> None:
    # The issuer's HTTPS server, with a certificate the bundle trusts, is no A-REX.
    endpoint = f"{arc_ce.issuer}/arex"
    client = ArcRestClient(endpoint, token_file=_token_for(arc_ce, tmp_path, endpoint),
                           ca_bundle=arc_ce.ca_bundle)
    with pytest.raises(ArcRefused) as err:
        client.statuses(None)
    assert err.value.status == 404 and not err.value.retryable
    assert str(err.value) == f"{arc_ce.issuer_host_port}: GET /arex/rest: 404 Not Found"
