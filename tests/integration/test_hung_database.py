"""A hung database: a throwaway PostgreSQL server of the test's own (initdb, pg_ctl) is stopped
with SIGSTOP while a real matcher server (gunicorn) runs over it. /healthz answers 503 with a
problem document instead of hanging, and 200 again once the server runs on. A request whose
database cannot be reached is a 503 problem ("try again"), never an HTML 500."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from sqlalchemy import text

from gridpilot import schema
from gridpilot.devserver import free_port, matcher_server
from matcher.auth import issue_token
from taskqueue.core.settings import DatabaseSettings
from taskqueue.db.database import make_engine
from taskqueue.db.health import HealthProbe

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hung-database-test-secret-0123456789"
PROBLEM = "application/problem+json"


def _as_server_user(argv: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: run it as the postgres account then.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


@pytest.fixture()
def private_postgres() -> Iterator[tuple[str, Path]]:
    """A PostgreSQL server on a free loopback port, its data in the test's folder; yields its
    URL and data folder, and removes it afterwards."""
    if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser to start PostgreSQL as postgres")
    # Its own folder outside the test's (whose parents the postgres account may not enter).
    home = Path(tempfile.mkdtemp(prefix="gridpilot-pg-"))
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
    data, port = home / "data", free_port()
    subprocess.run(_as_server_user(["initdb", "-D", str(data), "-U", "postgres",
                                    "--auth=trust", "-E", "UTF8"]),
                   check=True, capture_output=True)
    subprocess.run(_as_server_user([
        "pg_ctl", "-D", str(data), "-l", str(home / "log"), "-w", "-o",
        f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off", "start"]),
        check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", data
    finally:
        _signal_server(data, signal.SIGCONT)
        subprocess.run(_as_server_user(["pg_ctl", "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def _server_pids(data: Path) -> list[int]:
    """The postmaster of the data folder and all its children."""
    postmaster = int((data / "postmaster.pid").read_text().split()[0])
    children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    return [postmaster, *map(int, children)]


def _signal_server(data: Path, signum: signal.Signals) -> None:
    try:
        pids = _server_pids(data)
    except (OSError, ValueError, IndexError):
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _migrated(url: str, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The database brought to the schema (the matcher serves only such a database), a work
    folder for the matcher, and a user's request headers."""
    work = tmp_path / "work"
    work.mkdir()
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    token = issue_token(SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user",
                        lifetime=600)
    return work, {"Authorization": f"Bearer {token}"}


def test_healthz_answers_while_the_database_hangs(private_postgres: tuple[str, Path],
                                                  tmp_path: Path) -> None:
    url, data = private_postgres
    work, headers = _migrated(url, tmp_path)
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", work,
                        workers=1) as base:
        assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
        _signal_server(data, signal.SIGSTOP)
        try:
            for _ in range(3):
                # Before the fix this waited for as long as the server was stopped.
                answer = requests.get(f"{base}/healthz", timeout=8)
                assert answer.status_code == 503
                assert answer.headers["Content-Type"] == PROBLEM
                assert "database" in answer.json()["detail"]
            # A request needing a new connection fails with a problem document, not HTML.
            listing = requests.get(f"{base}/api/v1/jobs", timeout=25,
                                   headers=headers)
            assert listing.status_code == 503, listing.text
            assert listing.headers["Content-Type"] == PROBLEM
            assert "try again" in listing.json()["detail"]
        finally:
            _signal_server(data, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while requests.get(f"{base}/healthz", timeout=8).status_code != 200:
            assert time.monotonic() < deadline, "healthz did not recover"
            time.sleep(0.5)


def test_a_request_on_a_pooled_connection_to_a_frozen_database_answers_503(
        private_postgres: tuple[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's statement_timeout cannot fire while the server is stopped, and the
    kernel still acknowledges what is sent: the client side gives the statement up."""
    url, data = private_postgres
    work, headers = _migrated(url, tmp_path)
    monkeypatch.setenv("GRIDPILOT_DATABASE_STATEMENT_TIMEOUT", "3")
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", work,
                        workers=1) as base:
        for _ in range(3):  # connections in the pool
            assert requests.get(f"{base}/api/v1/jobs/1", headers=headers,
                                timeout=10).status_code == 404
        _signal_server(data, signal.SIGSTOP)
        try:
            # Without a client-side deadline this waits for as long as the server is stopped.
            answer = requests.get(f"{base}/api/v1/jobs/1", headers=headers, timeout=60)
            assert answer.status_code == 503, answer.text
            assert answer.headers["Content-Type"] == PROBLEM
            assert "Retry-After" in answer.headers
        finally:
            _signal_server(data, signal.SIGCONT)


def test_the_health_check_keeps_its_connection_and_replaces_one_the_server_closed(
        private_postgres: tuple[str, Path]) -> None:
    """Checks reuse one connection (the private server has no other client), and the first check
    after a server restart answers that the database is up: the dead connection is replaced
    within that check, not reported as an outage."""
    url, data = private_postgres
    probe = HealthProbe(DatabaseSettings(url=url))
    watcher = make_engine(url)
    try:
        assert probe.check() is None
        assert probe.check() is None
        with watcher.connect() as conn:
            sessions = conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> pg_backend_pid()")).scalar_one()
        assert sessions == 1
        watcher.dispose()
        subprocess.run(_as_server_user(["pg_ctl", "-D", str(data), "-l", str(data.parent / "log"),
                                        "-m", "fast", "-w", "restart"]),
                       check=True, capture_output=True)
        assert probe.check() is None
    finally:
        probe.dispose()
        watcher.dispose()


def test_a_check_waits_for_a_hung_one_instead_of_starting_another(
        private_postgres: tuple[str, Path]) -> None:
    """While the server is stopped, the first check (and a caller sharing it) answers within
    its deadline and later ones at once; after SIGCONT the probe answers again."""
    url, data = private_postgres
    probe = HealthProbe(DatabaseSettings(url=url), deadline=0.5, connect_allowance=0.5)
    try:
        assert probe.check() is None
        _signal_server(data, signal.SIGSTOP)
        try:
            answers: list[str | None] = []
            first = threading.Thread(target=lambda: answers.append(probe.check()))
            first.start()
            # A caller during the first check shares its answer instead of failing at once.
            shared = probe.check()
            first.join()
            assert shared is not None and "did not answer within 0.5 s" in shared
            assert answers[0] is not None and "did not answer within 0.5 s" in answers[0]
            started = time.monotonic()
            later = probe.check()
            assert later is not None and "has not answered a check" in later
            assert time.monotonic() - started < 0.4
        finally:
            _signal_server(data, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while probe.check() is not None:
            assert time.monotonic() < deadline, "the probe did not recover"
            time.sleep(0.2)
    finally:
        probe.dispose()


def test_healthz_answers_while_every_request_thread_waits_for_the_database(
        private_postgres: tuple[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker keeps a thread for /healthz (gridpilot.worker): with the one worker's four
    request threads all waiting for a stopped server, a balancer's check still gets its 503
    within the check's deadline instead of queueing behind them."""
    url, data = private_postgres
    work, headers = _migrated(url, tmp_path)
    # The requests below wait 20 s for the frozen server (a pooled connection's statement, or
    # a new connection); /healthz's own check gives up after 1 s.
    monkeypatch.setenv("GRIDPILOT_DATABASE_STATEMENT_TIMEOUT", "20")
    monkeypatch.setenv("GRIDPILOT_DATABASE_CONNECT_TIMEOUT", "20")
    monkeypatch.setenv("GRIDPILOT_DATABASE_LIVENESS_AFTER", "0")  # no early 503 here
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", work,
                        workers=1) as base:
        assert requests.get(f"{base}/api/v1/jobs/1", headers=headers,
                            timeout=10).status_code == 404
        answers: list[int] = []

        def ask() -> None:
            try:
                answers.append(requests.get(f"{base}/api/v1/jobs/1", headers=headers,
                                            timeout=90).status_code)
            except requests.RequestException:
                answers.append(-1)

        _signal_server(data, signal.SIGSTOP)
        askers = [threading.Thread(target=ask) for _ in range(8)]
        try:
            for asker in askers:
                asker.start()
            time.sleep(2)  # every request thread is now waiting for the server
            for _ in range(3):
                answer = requests.get(f"{base}/healthz", timeout=8)
                assert answer.status_code == 503
                assert "database" in answer.json()["detail"]
            assert not answers, "the requests were meant to be still waiting"
        finally:
            _signal_server(data, signal.SIGCONT)
            for asker in askers:
                asker.join(timeout=120)
        assert len(answers) == 8 and set(answers) <= {404, 503}, answers
        deadline = time.monotonic() + 30
        while requests.get(f"{base}/healthz", timeout=8).status_code != 200:
            assert time.monotonic() < deadline, "healthz did not recover"
            time.sleep(0.5)


def test_a_frozen_database_is_answered_503_long_before_the_statement_deadline(
        private_postgres: tuple[str, Path], tmp_path: Path) -> None:
    """With the default statement timeout (20 s), a match and a GET on pooled connections to a
    stopped server are answered 503 with Retry-After within a few seconds: past [database]
    liveness_after, a check on a connection of its own finds that the server does not answer,
    and the statement is given up (a statement the server is still running is not)."""
    url, data = private_postgres
    work, headers = _migrated(url, tmp_path)
    pilot = issue_token(SECRET, subject="pilots", role="pilot", vo="lhcb", group="lhcb_pilot",
                        lifetime=600)
    match = {"resource": {"vo": "lhcb", "site": "LCG.CERN.cern", "ce": "ce1.cern.ch",
                          "pilot_reference": "frozen-1", "cpu_time": 10**6}}
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", work,
                        workers=1) as base:
        def ask_match() -> requests.Response:
            return requests.post(f"{base}/api/v1/pilots/match", json=match, timeout=12,
                                 headers={"Authorization": f"Bearer {pilot}"})

        def ask_job() -> requests.Response:
            return requests.get(f"{base}/api/v1/jobs/1", headers=headers, timeout=12)

        assert ask_match().status_code == 200  # connections in the pools
        assert ask_job().status_code == 404
        _signal_server(data, signal.SIGSTOP)
        try:
            for ask in (ask_match, ask_job):
                # Before the fix each waited for the whole freeze (up to the 22 s deadline).
                answer = ask()
                assert answer.status_code == 503, answer.text
                assert answer.headers["Content-Type"] == PROBLEM
                assert answer.headers["Retry-After"]
                assert "try again" in answer.json()["detail"]
        finally:
            _signal_server(data, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while ask_job().status_code != 404:
            assert time.monotonic() < deadline, "the service did not recover"
            time.sleep(0.5)
        assert ask_match().status_code == 200


def test_a_long_statement_on_a_running_server_goes_on_past_the_liveness_check(
        private_postgres: tuple[str, Path]) -> None:
    """The liveness check gives up statements on a server that does not answer only: one the
    server is busy with runs on to the statement deadline."""
    url, _ = private_postgres
    probe = HealthProbe(DatabaseSettings(url=url))
    engine = make_engine(url, statement_timeout=60,
                         liveness=lambda: probe.check() is None, liveness_after=0.3)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_sleep(2), 7")).one()[1] == 7
    finally:
        engine.dispose()
        probe.dispose()
