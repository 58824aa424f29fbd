"""Two real matcher server processes over one database, 16 concurrent HTTP clients: every job
is handed out exactly once, and a site limit set through one process holds across both. One
server runs sync workers, the other threaded ones (gthread), whose concurrent claims go to the
database in groups on PostgreSQL (taskqueue.db.groupcommit); with no limit in the way, every claim
takes the database's claim function, grouped or not."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import func, select

from gridpilot import schema
from matcher.auth import issue_token
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine, make_session_factory, run_in_transaction
from taskqueue.db.models import Job, JobStatusHistory
from tests.conftest import SERVER_ENV, _server_database
from tests.helpers import requirements, submit

ROOT = Path(__file__).resolve().parents[2]
SECRET = "integration-test-secret-0123456789"
SITE = "LCG.CERN.cern"
USER_JOBS, MC_JOBS, MC_LIMIT = 4000, 1000, 50
CLIENTS = 16


@pytest.fixture(scope="module", params=sorted(SERVER_ENV))
def server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database on a server (PostgreSQL, MariaDB), its schema migrated."""
    backend: str = request.param
    if not os.environ.get(SERVER_ENV[backend]):
        # Only reached outside CI: with GRIDPILOT_TEST_REQUIRE_SERVERS=1, conftest refuses to
        # start without both servers.
        pytest.skip(f"{SERVER_ENV[backend]} is not set")
    urls = _server_database(backend)
    url = next(urls)
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    yield url
    next(urls, None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start_server(url: str, port: int, tmp: Path, threads: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GRIDPILOT_DATABASE_URL": url, "GRIDPILOT_AUTH_SECRET": SECRET,
           "GRIDPILOT_RESOURCES_FILE": str(ROOT / "conf" / "resources.toml"),
           "GRIDPILOT_MATCHER_METRICS_DIR": str(tmp / f"metrics-{port}"),
           "GRIDPILOT_MATCHER_THREADS": str(threads)}
    return subprocess.Popen(
        [sys.executable, "-m", "gridpilot", "--config", str(ROOT / "conf" / "gridpilot.toml"),
         "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_healthy(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            assert proc.stderr is not None
            pytest.fail(f"matcher at {base} exited: {proc.stderr.read().decode()}")
        try:
            if requests.get(f"{base}/healthz", timeout=5).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):  # not up, or slow to start
            pass
        time.sleep(0.2)
    pytest.fail(f"matcher at {base} did not become healthy")


@pytest.fixture()
def two_servers(server_url: str, tmp_path: Path) -> Iterator[list[str]]:
    procs: list[subprocess.Popen[bytes]] = []
    bases = []
    try:
        for threads in (1, 4):  # sync workers, threaded workers
            port = _free_port()
            procs.append(_start_server(server_url, port, tmp_path, threads))
            bases.append(f"http://127.0.0.1:{port}")
        for base, proc in zip(bases, procs, strict=True):
            _wait_healthy(base, proc)
        yield bases
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
            if proc.stderr is not None:
                proc.stderr.close()


def _fill(url: str) -> None:
    engine = make_engine(url)
    factory = make_session_factory(engine)
    now = datetime.now(UTC)
    settings = Settings()
    rng = random.Random(3)
    for job_type, n in (("User", USER_JOBS), ("MCSimulation", MC_JOBS)):
        for start in range(0, n, 500):
            reqs = [requirements(owner=f"user{i % 7}", job_type=job_type, cpu_time=3600)
                    for i in range(start, min(n, start + 500))]
            run_in_transaction(factory, lambda s, r=reqs: submit(s, settings, now, r, rng=rng))
    engine.dispose()


def _client(base: str, token: str, pilot: str, seed: int, got: list[int],
            reasons: list[str], errors: list[str], site: str = SITE) -> None:
    rng = random.Random(seed)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    misses = 0
    while misses < 3:
        body: dict[str, Any] = {"resource": {"vo": "lhcb", "site": site, "ce": "ce1.cern.ch",
                                             "pilot_reference": pilot, "cpu_time": 10**6},
                                "count": rng.choice((1, 1, 2, 4))}
        response = session.post(f"{base}/api/v1/pilots/match", json=body, timeout=30)
        if response.status_code != 200:
            errors.append(f"{response.status_code}: {response.text}")
            return
        answer = response.json()
        if answer["jobs"]:
            got.extend(job["job_id"] for job in answer["jobs"])
            misses = 0
        else:
            reasons.append(answer["no_match"]["reason"])
            misses += 1
            time.sleep(0.05)


def _pilots_until_empty(servers: list[str], site: str, name: str
                        ) -> tuple[list[list[int]], list[list[str]]]:
    """CLIENTS pilots of ``site`` (named ``name-i``), spread over the servers, each asking
    until three answers in a row are empty: the jobs each got, and its no-match reasons."""
    pilot = issue_token(SECRET, subject="pilots", role="pilot", vo="lhcb", group="lhcb_pilot",
                        lifetime=600, site=site)
    got: list[list[int]] = [[] for _ in range(CLIENTS)]
    reasons: list[list[str]] = [[] for _ in range(CLIENTS)]
    errors: list[str] = []
    threads = [threading.Thread(target=_client, args=(
        servers[i % len(servers)], pilot, f"{name}-{i}", i, got[i], reasons[i], errors, site))
        for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert errors == []
    return got, reasons


@pytest.mark.slow
def test_two_processes_hand_out_each_job_once_and_share_limits(
        server_url: str, two_servers: list[str]) -> None:
    _fill(server_url)
    operator = issue_token(SECRET, subject="op", role="operator", vo="lhcb",
                           group="lhcb_admin", lifetime=600)
    limit = requests.post(f"{two_servers[0]}/api/v1/limits",
                          headers={"Authorization": f"Bearer {operator}"},
                          json={"site": SITE, "attribute": "job_type",
                                "value": "MCSimulation", "max_running": MC_LIMIT}, timeout=30)
    assert limit.status_code == 200, limit.text

    got, reasons = _pilots_until_empty(two_servers, SITE, "pilot")

    handed = [job_id for ids in got for job_id in ids]
    duplicates = [job_id for job_id, n in Counter(handed).items() if n > 1]
    assert duplicates == []
    assert len(handed) == USER_JOBS + MC_LIMIT
    # Every client's last answers: MC jobs still wait, held back by the limit.
    assert {r for rs in reasons for r in rs[-3:]} == {"held_by_limits"}

    engine = make_engine(server_url)
    factory = make_session_factory(engine)
    with factory() as session:
        matched = dict(session.execute(
            select(Job.job_type, func.count()).where(Job.status == "Matched")
            .group_by(Job.job_type)).all())
        assert matched == {"User": USER_JOBS, "MCSimulation": MC_LIMIT}
        assert session.execute(select(func.count()).select_from(Job).where(
            Job.status == "Waiting")).scalar_one() == MC_JOBS - MC_LIMIT
        # One Matched history row per handed-out job, each with the pilot that got it.
        history = session.execute(select(func.count()).select_from(JobStatusHistory).where(
            JobStatusHistory.status == "Matched")).scalar_one()
        assert history == len(handed)
        owners = dict(session.execute(
            select(Job.id, Job.pilot_reference).where(Job.id.in_(got[0]))).all())
        assert set(owners.values()) <= {"pilot-0"}
    engine.dispose()


@pytest.mark.slow
def test_threaded_servers_hand_out_each_job_once_through_the_claim_function(
        server_url: str, two_servers: list[str]) -> None:
    _fill(server_url)  # beside what an earlier test of the module left waiting
    engine = make_engine(server_url)
    factory = make_session_factory(engine)
    with factory() as session:
        waiting = session.execute(select(func.count()).select_from(Job).where(
            Job.status == "Waiting")).scalar_one()
    site = "LCG.Free.org"  # no limits: every claim is the database's claim function
    got, reasons = _pilots_until_empty(two_servers, site, "free")
    handed = [job_id for ids in got for job_id in ids]
    assert [job_id for job_id, n in Counter(handed).items() if n > 1] == []
    assert len(handed) == waiting >= USER_JOBS + MC_JOBS
    assert {r for rs in reasons for r in rs[-3:]} == {"no_matching_job"}
    with factory() as session:
        mine = dict(session.execute(select(Job.id, Job.pilot_reference).where(
            Job.status == "Matched", Job.site == site)).all())
        assert sorted(mine) == sorted(handed)
        for i, ids in enumerate(got):  # each job recorded against the pilot that got it
            assert {mine[job_id] for job_id in ids} <= {f"free-{i}"}
        assert session.execute(select(func.count()).select_from(JobStatusHistory).where(
            JobStatusHistory.status == "Matched",
            JobStatusHistory.job_id.in_(handed))).scalar_one() == len(handed)
    engine.dispose()
