"""gridpilot as a VO runs it (tools/topology): TLS in nginx, HAProxy balancing three matcher
instances with health checks, PgBouncer in transaction mode before PostgreSQL, the agents on
their own, Prometheus scraping all of them with the shipped rules, Alertmanager.

The failover test runs HTTP pilots through the balancer while a matcher instance is killed
and started again, and while PgBouncer is restarted: no job is handed to two pilots, none is
lost, and every request that fails says when to come back (Retry-After). Its figures (the
failed requests and how long each recovery took) are written to
``work/artifacts/topology/failover.json`` (or ``$GRIDPILOT_TEST_ARTIFACTS``)."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from sqlalchemy import func, select

from matcher.auth import issue_token
from matcher.dashboard import session as cookies
from pilot.client import Backoff, MatcherClient, RefusedError, TransientError
from taskqueue.core.definitions import JobRequirements
from taskqueue.core.settings import Settings
from taskqueue.db.database import Session, make_engine, make_session_factory, run_in_transaction
from taskqueue.db.models import Job, JobStatusHistory, Pilot
from taskqueue.pilots.records import FINAL_PILOT_STATES
from tests.helpers import requirements, submit
from tests.integration.conftest import ROOT, Topology

PROBLEM = "application/problem+json"
SITE = "LCG.CERN.cern"


def _wait_for(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.2)


def _prometheus(topology: Topology, path: str, **query: str) -> Any:
    answer = requests.get(f"http://127.0.0.1:{topology.port('prometheus')}/api/v1/{path}",
                          params=query, timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "success", body
    return body["data"]


# -- TLS, the balancer, the public URL -----------------------------------------------------

def test_tls_in_front_and_every_instance_behind(topology: Topology) -> None:
    http = topology.http()
    served: Counter[str] = Counter()
    for _ in range(30):
        answer = http.get(f"{topology.url}/healthz", timeout=30)
        assert answer.status_code == 200
        assert answer.json() == {"status": "ok", "database": "ok"}
        served[answer.headers["X-Gridpilot-Instance"]] += 1
    assert set(served) == {"matcher-1", "matcher-2", "matcher-3"}
    # The certificate is the test CA's, for localhost: anyone else's trust store refuses it.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{topology.url}/healthz", timeout=30, verify=requests.certs.where())
    context = ssl.create_default_context(cafile=topology.ca)
    with context.wrap_socket(socket.create_connection(("127.0.0.1", topology.port("nginx")),
                                                      timeout=30),
                             server_hostname="localhost") as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    # Plain HTTP to the TLS port is refused.
    plain = requests.get(f"http://127.0.0.1:{topology.port('nginx')}/healthz", timeout=30)
    assert plain.status_code == 400


def test_the_service_knows_its_public_url(topology: Topology) -> None:
    http = topology.http()
    document = http.get(f"{topology.url}/api/v1/openapi.json", timeout=30).json()
    assert document["servers"] == [{"url": topology.url}]
    form = http.get(f"{topology.url}/ui/login", timeout=30)
    assert form.status_code == 200
    login_cookie = [c for c in http.cookies if c.name == cookies.LOGIN_COOKIE]
    assert login_cookie and all(c.secure for c in login_cookie), http.cookies
    # A client that names another host still gets the public name back.
    spoofed = http.get(f"{topology.url}/api/v1/openapi.json", timeout=30,
                       headers={"Host": "evil.example.org"})
    assert spoofed.status_code == 200
    assert spoofed.json()["servers"] == [{"url": topology.url}]
    # Straight to an instance, from loopback: the forwarded headers of a client that is not
    # one of the proxies are ignored (gunicorn's own default trusted loopback).
    direct = requests.get(f"http://127.0.0.1:{topology.port('matcher-1')}/api/v1/openapi.json",
                          timeout=30, headers={"X-Forwarded-Proto": "https",
                                               "X-Forwarded-Host": "evil.example.org",
                                               "X-Forwarded-For": "127.0.0.2"})
    assert direct.json()["servers"] == [{"url": f"http://127.0.0.1:{topology.port('matcher-1')}"}]


def test_sandbox_upload_urls_are_public(topology: Topology) -> None:
    token = issue_token(topology.state["secret"], subject="uploader", role="user", vo="lhcb",
                        group="lhcb_user", lifetime=600)
    checksum = "ab" * 32
    answer = topology.http().post(f"{topology.url}/api/v1/sandboxes", timeout=30,
                                  json={"checksum": checksum, "size": 10},
                                  headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["upload"]["url"] == (
        f"{topology.url}/api/v1/sandboxes/sb:sha256:{checksum}")


def _shell(topology: Topology, script: str, timeout: float = 120
           ) -> subprocess.CompletedProcess[str]:
    """``script`` in bash after ``eval "$(tools/topology env)"``, in an environment that
    names no service, token or CA of its own, with the client beside this Python first on
    PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GRIDPILOT_", "BEARER_TOKEN")) and k not in (
               "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "X509_CERT_DIR")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["XDG_CONFIG_HOME"] = str(topology.folder / "no-client-config")
    tool = f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'tools' / 'topology'))}"
    prologue = f'eval "$({tool} env --dir {shlex.quote(str(topology.folder))})"\n'
    return subprocess.run(["bash", "-euc", prologue + script], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=topology.folder)


def test_env_gives_the_client_all_it_needs_and_the_directors_pilot_runs_the_job(
        topology: Topology) -> None:
    """`eval "$(tools/topology env)"`, then `gridpilot-client submit` and `wait`: a job of the
    sample queue DIRAC.Demo.local/localhost/local ends Done, run by a real pilot that the
    topology's director started through PSI/J's local executor, and that reached the https URL
    by the topology's CA the director shipped with it ([matcher] ca_bundle)."""
    shown = _shell(topology, 'printf "%s\\n" "$GRIDPILOT_URL" "$GRIDPILOT_CA_BUNDLE" '
                             '"$GRIDPILOT_TOKEN_FILE" "$GRIDPILOT_OPERATOR_TOKEN_FILE"')
    assert shown.returncode == 0, shown.stderr
    url, ca, user_token, operator_token = shown.stdout.split("\n")[:4]
    assert (url, ca) == (topology.url, topology.ca)
    for token in (user_token, operator_token):
        assert os.stat(token).st_mode & 0o777 == 0o600, token
    (topology.folder / "hello.jdl").write_text(
        '[ Executable = "/bin/echo"; Arguments = "hello from the topology"; CPUTime = 300; '
        'Site = "DIRAC.Demo.local" ]\n')
    submitted = _shell(topology, "gridpilot-client submit hello.jdl")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.split()[0]
    waited = _shell(topology, f"gridpilot-client wait {job_id} --timeout 400 --interval 1",
                    timeout=500)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    shown = _shell(topology, f"gridpilot-client status {job_id} --json")
    assert shown.returncode == 0, shown.stderr
    (job,) = json.loads(shown.stdout)["jobs"]
    assert job["status"] == "Done" and job["site"] == "DIRAC.Demo.local", job
    # The operator's token: the pilot goes (through its CE), not left for its idle timeout.
    killed = _shell(topology, 'gridpilot-client --token-file "$GRIDPILOT_OPERATOR_TOKEN_FILE" '
                              f'pilot-kill {shlex.quote(job["pilot_reference"])}')
    assert killed.returncode == 0, killed.stdout + killed.stderr
    engine = make_engine(topology.state["direct_url"])
    try:
        def ended() -> bool:
            with make_session_factory(engine)() as session:
                pilot = session.scalars(select(Pilot).where(
                    Pilot.reference == job["pilot_reference"])).one()
                return pilot.status in FINAL_PILOT_STATES
        _wait_for("the pilot's end", ended, timeout=120)
    finally:
        engine.dispose()


def test_the_proxies_own_errors_say_when_to_come_back(topology: Topology) -> None:
    """nginx with HAProxy stopped, HAProxy with no instance behind it: problem documents
    with Retry-After, never an HTML page."""
    http = topology.http()
    topology.tool("stop", "haproxy")
    try:
        answer = http.post(f"{topology.url}/api/v1/pilots/match", json={}, timeout=30)
        assert answer.status_code == 503
        assert answer.headers["Content-Type"] == PROBLEM
        assert int(answer.headers["Retry-After"]) > 0
        assert "try again" in answer.json()["detail"]
    finally:
        topology.tool("start", "haproxy")
    balancer = f"http://127.0.0.1:{topology.port('haproxy')}"
    # Every instance drained at the balancer: HAProxy answers itself.
    for name in ("matcher-1", "matcher-2", "matcher-3"):
        topology.balancer(f"set server matchers/{name} state maint")
    try:
        answer = requests.get(f"{balancer}/healthz", timeout=30)
        assert answer.status_code == 503
        assert answer.headers["Content-Type"] == PROBLEM
        assert int(answer.headers["Retry-After"]) > 0
    finally:
        for name in ("matcher-1", "matcher-2", "matcher-3"):
            topology.balancer(f"set server matchers/{name} state ready")
    _wait_for("every instance back in rotation",
              lambda: set(topology.server_states().values()) == {"UP"})


# -- PgBouncer ------------------------------------------------------------------------------

def test_the_matchers_reach_postgresql_through_pgbouncer(topology: Topology) -> None:
    config = {row[0]: row[1] for row in topology.admin("SHOW CONFIG")}
    assert config["pool_mode"] == "transaction"
    clients = topology.admin("SHOW CLIENTS")
    database = topology.state["database"]
    assert any(database in row and "gridpilot" in row for row in clients), clients
    # The statement timeout the matchers cannot send through PgBouncer is the database's.
    password = topology.password("gridpilot")
    url = f"postgresql://gridpilot:{password}@127.0.0.1:{topology.port('pgbouncer')}/{database}"
    with psycopg.connect(url, prepare_threshold=None, autocommit=True) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("20s",)


def test_pgbouncer_wants_a_password_from_a_private_file(topology: Topology) -> None:
    port, database = topology.port("pgbouncer"), topology.state["database"]
    for user in ("gridpilot", "gpadmin"):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(f"postgresql://{user}@127.0.0.1:{port}/{database}",
                            password="", connect_timeout=10).close()
        with pytest.raises(psycopg.OperationalError, match="SASL authentication failed"):
            psycopg.connect(f"postgresql://{user}@127.0.0.1:{port}/{database}",
                            password="wrong-" + topology.password(user),
                            connect_timeout=10).close()
    config = {row[0]: row[1] for row in topology.admin("SHOW CONFIG")}
    assert config["auth_type"] == "scram-sha-256"
    userlist = Path(config["auth_file"])
    assert userlist.stat().st_mode & 0o777 == 0o600
    text = userlist.read_text()
    assert all(line.split(" ", 1)[1].startswith('"SCRAM-SHA-256$')
               for line in text.splitlines()), "the file holds SCRAM verifiers only"
    assert not any(topology.password(user) in text for user in ("gridpilot", "gpadmin"))


def test_haproxy_stats_want_credentials(topology: Topology) -> None:
    base = f"http://127.0.0.1:{topology.port('haproxy_stats')}"
    credentials = ("prometheus", topology.password("haproxy_stats"))
    for path in ("/stats", "/metrics"):
        assert requests.get(base + path, timeout=10).status_code == 401
        assert requests.get(base + path, timeout=10,
                            auth=(credentials[0], "wrong")).status_code == 401
        assert requests.get(base + path, timeout=10, auth=credentials).status_code == 200


def _tls12_handshake(topology: Topology, ciphers: str) -> bool:
    context = ssl.create_default_context(cafile=topology.ca)
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(ciphers)
    with socket.create_connection(("127.0.0.1", topology.port("nginx")), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost"):
                return True
        except ssl.SSLError:
            return False


def test_nginx_sends_hsts_hides_its_version_and_refuses_old_ciphers(
        topology: Topology) -> None:
    http = topology.http()
    for path in ("/healthz", "/api/v1/no-such-thing"):
        answer = http.get(topology.url + path, timeout=30)
        assert answer.headers["Strict-Transport-Security"].startswith("max-age=63072000")
        assert answer.headers["Server"] == "nginx"  # no version
    # the certificate's key is ECDSA: an AEAD cipher of the list passes, CBC ones, which
    # nginx's default list (HIGH:!aNULL:!MD5) accepts, do not
    assert _tls12_handshake(topology, "ECDHE-ECDSA-AES128-GCM-SHA256")
    assert not _tls12_handshake(topology, "ECDHE-ECDSA-AES128-SHA")
    assert not _tls12_handshake(topology, "ECDHE-ECDSA-AES256-SHA384")
    context = ssl.create_default_context(cafile=topology.ca)
    context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_3
    with socket.create_connection(("127.0.0.1", topology.port("nginx")), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        assert tls.version() == "TLSv1.3"


# -- failover under load --------------------------------------------------------------------

JOBS = 3000
PILOTS = 16


@dataclass
class Request:
    at: float
    method: str
    path: str
    status: int | None  # None: no answer at all
    retry_after: str | None
    detail: str
    ended: float = 0.0


@dataclass
class Ledger:
    """What the pilots saw, shared by their threads (list appends are atomic)."""

    failures: list[Request] = field(default_factory=list)
    matched_at: list[float] = field(default_factory=list)
    confirmed: list[tuple[str, int]] = field(default_factory=list)
    done: list[int] = field(default_factory=list)
    refused: list[tuple[str, int, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class RecordedSession(requests.Session):
    """A pilot's HTTP session that keeps every answer of 400 or more, and every request that
    got no answer at all."""

    def __init__(self, ledger: Ledger, ca: str) -> None:
        super().__init__()
        self.ledger = ledger
        self.verify = ca
        self.trust_env = False  # REQUESTS_CA_BUNDLE would win over verify

    def request(self, method: str | bytes, url: str | bytes, *args: Any,
                **kwargs: Any) -> requests.Response:
        at = time.monotonic()
        path = urllib.parse.urlsplit(str(url)).path
        try:
            answer = super().request(method, url, *args, **kwargs)
        except requests.RequestException as exc:
            self.ledger.failures.append(Request(at, str(method), path, None, None, repr(exc),
                                                time.monotonic()))
            raise
        if answer.status_code >= 400:
            self.ledger.failures.append(Request(at, str(method), path, answer.status_code,
                                                answer.headers.get("Retry-After"),
                                                answer.text[:300], time.monotonic()))
        elif path.endswith("/pilots/match"):
            self.ledger.matched_at.append(time.monotonic())
        return answer


def _fill(url: str) -> set[int]:
    engine = make_engine(url)
    factory = make_session_factory(engine)
    now, settings, ids = datetime.now(UTC), Settings(), set()
    rng = random.Random(5)
    for start in range(0, JOBS, 500):
        reqs = [requirements(vo="failover", owner=f"user{i % 5}", owner_group="failover_user",
                             sites=[SITE], cpu_time=3600) for i in range(start, start + 500)]
        ids |= set(run_in_transaction(factory, partial(_submit, settings=settings, now=now,
                                                        reqs=reqs, rng=rng)))
    engine.dispose()
    return ids


def _submit(session: Session, *, settings: Settings, now: datetime,
            reqs: list[JobRequirements], rng: random.Random) -> list[int]:
    return submit(session, settings, now, reqs, rng=rng)


def _pilot(topology: Topology, ledger: Ledger, token: str, index: int,
           stop: threading.Event) -> None:
    reference = f"failover-pilot-{index}"
    client = MatcherClient(topology.url, token, timeout=40,
                           session=RecordedSession(ledger, topology.ca))
    rng = random.Random(index)
    backoff = Backoff(base=0.1, cap=2.0, rng=rng)
    resource = {"vo": "failover", "site": SITE, "ce": "ce503.cern.ch",
                "pilot_reference": reference, "cpu_time": 10**6}

    def report(job_id: int, status: str) -> bool:
        body: dict[str, Any] = {"pilot_reference": reference, "status": status}
        if status == "Done":
            body["exit_code"] = 0
        retry = Backoff(base=0.1, cap=2.0, rng=rng)
        while not stop.is_set():
            try:
                client.report(job_id, body)
                return True
            except RefusedError as exc:
                ledger.refused.append((status, job_id, f"{exc.status} {exc.detail}"))
                return False
            except TransientError:
                time.sleep(retry.next_delay())
        return False

    try:
        while not stop.is_set():
            try:
                answer = client.match(resource, count=rng.choice((1, 2)))
            except TransientError:
                time.sleep(backoff.next_delay())
                continue
            backoff.reset()
            if not answer.jobs:
                time.sleep(0.2)
                continue
            for job in answer.jobs:
                if not report(job.job_id, "Running"):
                    continue  # taken back (unconfirmed for too long): another pilot runs it
                ledger.confirmed.append((reference, job.job_id))
                if report(job.job_id, "Done"):
                    ledger.done.append(job.job_id)
    except Exception as exc:  # the test fails with it
        ledger.errors.append(f"{reference}: {type(exc).__name__}: {exc}")


@pytest.fixture()
def failover_jobs(topology: Topology) -> Iterator[set[int]]:
    yield _fill(topology.state["direct_url"])


@pytest.mark.slow
def test_failover_under_load(topology: Topology, failover_jobs: set[int]) -> None:
    token = issue_token(topology.state["secret"], subject="failover-pilots", role="pilot",
                        vo="failover", group="failover_pilot", lifetime=3600, site=SITE)
    ledger, stop = Ledger(), threading.Event()
    threads = [threading.Thread(target=_pilot, args=(topology, ledger, token, i, stop),
                                name=f"pilot-{i}") for i in range(PILOTS)]
    started = time.monotonic()
    events: dict[str, float] = {}
    load = os.getloadavg()[0]
    for thread in threads:
        thread.start()
    try:
        # 1. A matcher instance dies (SIGKILL to its process group) and is started again.
        _wait_for("15% of the jobs done", lambda: len(ledger.done) >= JOBS * 0.15, 600)
        events["matcher killed"] = time.monotonic()
        topology.tool("kill", "matcher-2")
        _wait_for("the balancer to take matcher-2 out",
                  lambda: topology.server_states()["matcher-2"].startswith("DOWN"), 60)
        events["matcher out of rotation"] = time.monotonic()
        time.sleep(2)
        events["matcher starting"] = time.monotonic()
        topology.tool("start", "matcher-2")
        events["matcher healthy"] = time.monotonic()
        _wait_for("the balancer to take matcher-2 back",
                  lambda: topology.server_states()["matcher-2"] == "UP", 60)
        events["matcher in rotation"] = time.monotonic()
        # 2. PgBouncer stops at once (every server and client connection cut) and starts.
        _wait_for("55% of the jobs done, 10 s after the instance came back", lambda: (
            len(ledger.done) >= JOBS * 0.55
            and time.monotonic() > events["matcher in rotation"] + 10), 600)
        events["pgbouncer stopped"] = time.monotonic()
        topology.tool("kill", "pgbouncer")
        time.sleep(2)
        events["pgbouncer starting"] = time.monotonic()
        topology.tool("start", "pgbouncer")
        events["pgbouncer up"] = time.monotonic()
        _wait_for("a match after PgBouncer's restart",
                  lambda: any(t > events["pgbouncer up"] for t in ledger.matched_at), 120)
        events["first match after pgbouncer"] = min(
            t for t in ledger.matched_at if t > events["pgbouncer up"])
        # 3. Every job done; lost matches come back after [agents] matched_lease (15 s here).
        _wait_for("every job done", lambda: len(set(ledger.done)) >= JOBS or ledger.errors,
                  300)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    finished = time.monotonic()

    assert ledger.errors == []
    confirmed = Counter(job_id for _, job_id in ledger.confirmed)
    duplicated = sorted(job_id for job_id, n in confirmed.items() if n > 1)
    lost = sorted(failover_jobs - set(ledger.done))
    assert duplicated == []
    assert lost == []
    assert Counter(ledger.done) == Counter(failover_jobs)  # each reported Done once
    # A request in flight when its instance is killed can lose its answer half-way (the
    # headers relayed, the body cut): no balancer can answer for it, and the pilot retries.
    # Every other unanswered request, and every 5xx, must say when to come back.
    killed = events["matcher killed"]
    cut_by_the_kill = [r for r in ledger.failures
                       if r.status is None and r.at <= killed + 0.5 and r.ended >= killed]
    without_retry_after = [asdict(r) for r in ledger.failures
                           if (r.status is None or r.status >= 500) and not r.retry_after
                           and r not in cut_by_the_kill]
    assert without_retry_after == []
    # The only refusals: Running reported for a match that had been taken back (the job
    # waits again, or another pilot holds it).
    assert {(status, text.split()[0]) for status, _, text in ledger.refused} <= {
        ("Running", "403"), ("Running", "409")}, ledger.refused[:5]
    assert all(job_id not in confirmed or confirmed[job_id] == 1
               for _, job_id, _ in ledger.refused)
    # The database agrees: each job Done once, by the pilot that confirmed it.
    engine = make_engine(topology.state["direct_url"])
    try:
        with make_session_factory(engine)() as session:
            statuses = dict(session.execute(
                select(Job.status, func.count()).where(Job.vo == "failover")
                .group_by(Job.status)).all())
            assert statuses == {"Done": JOBS}
            done_rows = session.execute(
                select(JobStatusHistory.job_id, func.count())
                .join(Job, Job.id == JobStatusHistory.job_id)
                .where(Job.vo == "failover", JobStatusHistory.status == "Done")
                .group_by(JobStatusHistory.job_id)).all()
            assert {n for _, n in done_rows} == {1} and len(done_rows) == JOBS
            holders = dict(session.execute(select(Job.id, Job.pilot_reference)
                                           .where(Job.vo == "failover")).all())
            assert all(holders[job_id] == reference for reference, job_id in ledger.confirmed)
            # Matches whose answer was lost, taken back after the lease and matched again.
            rematched = session.execute(select(func.count()).select_from(
                select(JobStatusHistory.job_id).join(Job, Job.id == JobStatusHistory.job_id)
                .where(Job.vo == "failover", JobStatusHistory.status == "Matched")
                .group_by(JobStatusHistory.job_id).having(func.count() > 1).subquery())
            ).scalar_one()
    finally:
        engine.dispose()

    figures = _figures(ledger, events, started, finished, load)
    figures["jobs_matched_again_after_a_lost_answer"] = rematched
    figures["answers_cut_by_the_kill"] = len(cut_by_the_kill)
    _write_figures(figures)


def _window(failures: list[Request], start: float, end: float) -> dict[str, Any]:
    inside = [r for r in failures if start <= r.at <= end]
    details = Counter(f"{r.status} {_said(r.detail)}" for r in inside)
    return {"failed_requests": len(inside),
            "by_status": dict(Counter(str(r.status) for r in inside)),
            "answers": dict(details.most_common(4)),
            "failing_for_s": round(max(r.at for r in inside) - min(r.at for r in inside), 2)
            if inside else 0.0}


def _said(text: str) -> str:
    """Who answered, from a problem document's detail."""
    try:
        detail = str(json.loads(text).get("detail", ""))
    except ValueError:
        return text[:60]
    if "matcher instance" in detail or "the service did not answer" in detail:
        return f"(proxy) {detail[:60]}"
    return f"(matcher) {detail[:60]}"


def _figures(ledger: Ledger, events: dict[str, float], started: float, finished: float,
             load: float) -> dict[str, Any]:
    e = events
    return {
        "jobs": JOBS, "pilots": PILOTS, "matchers": 3,
        "seconds": round(finished - started, 1),
        "jobs_per_second": round(JOBS / (finished - started), 1),
        "load_average_at_start": round(load, 2), "cores": os.cpu_count(),
        "duplicated": 0, "lost": 0,
        "failed_requests": len(ledger.failures),
        "failed_without_retry_after": 0,
        "refused_running_reports_of_taken_back_matches": len(ledger.refused),
        "matcher_kill": {
            "out_of_rotation_after_s": round(e["matcher out of rotation"] - e["matcher killed"],
                                             2),
            "start_to_healthy_s": round(e["matcher healthy"] - e["matcher starting"], 2),
            "healthy_to_in_rotation_s": round(e["matcher in rotation"] - e["matcher healthy"],
                                              2),
            **_window(ledger.failures, e["matcher killed"], e["pgbouncer stopped"]),
        },
        "pgbouncer_restart": {
            "down_s": round(e["pgbouncer starting"] - e["pgbouncer stopped"], 2),
            "first_match_after_start_s": round(e["first match after pgbouncer"]
                                               - e["pgbouncer up"], 2),
            **_window(ledger.failures, e["pgbouncer stopped"], finished),
        },
    }


def _write_figures(figures: dict[str, Any]) -> None:
    base = Path(os.environ.get("GRIDPILOT_TEST_ARTIFACTS") or ROOT / "work" / "artifacts")
    folder = base / "topology"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "failover.json").write_text(json.dumps(figures, indent=2) + "\n")
    print("failover figures:", json.dumps(figures))


# -- monitoring -----------------------------------------------------------------------------

def test_prometheus_scrapes_everything_and_alerts_reach_alertmanager(
        topology: Topology) -> None:
    def all_up() -> list[dict[str, Any]] | None:
        targets = _prometheus(topology, "targets")["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    targets = _wait_for("every target up", all_up, 60)
    jobs = Counter(t["labels"]["job"] for t in targets)
    assert jobs == {"gridpilot-matcher": 3, "gridpilot-agents": 1, "haproxy": 1,
                    "alertmanager": 1, "prometheus": 1}
    rules = [r for g in _prometheus(topology, "rules")["groups"] for r in g["rules"]]
    assert len(rules) >= 17 and all(r["health"] == "ok" for r in rules), rules
    firing = {r["name"] for r in rules if r.get("state") == "firing"}
    assert firing == {"GridpilotWatchdog"}  # all is well: nothing else fires
    alertmanager = f"http://127.0.0.1:{topology.port('alertmanager')}/api/v2/alerts"
    _wait_for("the watchdog's alert at Alertmanager", lambda: any(
        a["labels"]["alertname"] == "GridpilotWatchdog"
        for a in requests.get(alertmanager, timeout=30).json()), 60)
    # The matchers' metrics, scraped with the metrics token.
    # Each process says whether the database answered its last scrape's check; after the
    # failover test's PgBouncer restart, a scrape may still hold an instance's failed check.
    def database_up() -> list[dict[str, Any]] | None:
        up = _prometheus(topology, "query", query="gridpilot_database_up")["result"]
        return up if {(r["metric"]["job"], r["value"][1]) for r in up} == {
            ("gridpilot-matcher", "1"), ("gridpilot-agents", "1")} else None

    up = _wait_for("every process's database check up", database_up, 90)
    assert len(up) == 4


#: Values of the dashboard's variables and Grafana's own, for running its queries here.
_GRAFANA = {"$__rate_interval": "1m", "$__interval": "15s", "${datasource}": ""}


def test_every_dashboard_query_runs_on_the_live_prometheus(topology: Topology) -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "gridpilot.json").read_text())
    queries = [(panel["title"], target["expr"]) for panel in dashboard["panels"]
               for target in panel.get("targets", [])]
    assert len(queries) >= 15
    empty = []
    for title, expr in queries:
        for name, value in _GRAFANA.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, f"{title}: a variable this test does not know: {expr}"
        result = _prometheus(topology, "query", query=expr)["result"]
        if not result:
            empty.append(title)
    # After the tests above (matches, a failover), only what nothing caused is empty: no
    # pilot of the director ended, no sandbox stored, perhaps no 5xx in the last minutes.
    allowed_empty = {"Pilots ended in the last hour, by site and status", "Sandbox store",
                     "No matches, by reason", "Share of 5xx answers", "Waiting jobs",
                     "Site director: failures in a row, per queue"}
    assert set(empty) <= allowed_empty, empty
    assert re.search(r'"uid": "gridpilot"', json.dumps(dashboard))
