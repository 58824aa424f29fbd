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
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gridpilot import schema
from gridpilot.devserver import free_port, matcher_server
from matcher.auth import issue_token
from taskqueue.database import make_engine

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


def test_healthz_answers_while_the_database_hangs(private_postgres: tuple[str, Path],
                                                  tmp_path: Path) -> None:
    url, data = private_postgres
    work = tmp_path / "work"
    work.mkdir()
    token = issue_token(SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user",
                        lifetime=600)
    engine = make_engine(url)  # the matcher serves only a database with the schema
    schema.upgrade(engine)
    engine.dispose()
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
                                   headers={"Authorization": f"Bearer {token}"})
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
    work = tmp_path / "work"
    work.mkdir()
    token = issue_token(SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user",
                        lifetime=600)
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    monkeypatch.setenv("GRIDPILOT_DATABASE_STATEMENT_TIMEOUT", "3")
    headers = {"Authorization": f"Bearer {token}"}
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
