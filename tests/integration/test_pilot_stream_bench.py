"""bench/pilot_stream.py at a tiny size: it runs on every configured database, its JSON lines
parse, and it reports no miss, no duplicate and no violation; its own matching rules (which
judge the claims) agree with the library's on its workload. No timing is asserted."""

from __future__ import annotations

import importlib
import json
import os
import pstats
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from taskqueue.core.resources import parse_resource
from taskqueue.db.models import task_queues_table
from taskqueue.matching.claim import matching_queues
from tests.conftest import BACKENDS, SERVER_ENV, Database

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "pilot_stream.py"


def bench_module() -> ModuleType:
    """bench/pilot_stream.py as its scripts see it: their folder first on sys.path (for this
    import only; none of its modules' names is one of the project's packages)."""
    folder = str(BENCH.parent)
    sys.path.insert(0, folder)
    try:
        return importlib.import_module("pilot_stream")
    finally:
        sys.path.remove(folder)


@pytest.fixture(params=BACKENDS)
def bench_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of its own for one benchmark run (SQLite file, or one made on the server)."""
    backend: str = request.param
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'stream.db'}"
        return
    base = make_url(os.environ[SERVER_ENV[backend]])
    name = f"gp_test_stream_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            force = " WITH (FORCE)" if backend == "postgresql" else ""
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}{force}"))
        admin.dispose()


def run_bench(*args: str) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, str(BENCH), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_tiny_run_is_correct(bench_url: str) -> None:
    records = run_bench("--url", bench_url, "--jobs", "300", "--k", "10,100",
                        "--calibration-seconds", "0.5",
                        "--processes", "1,2", "--background-jobs", "500",
                        "--background-queues", "20", "--seed", "7")
    streams = [r for r in records if r["measure"] == "pilot_stream"]
    assert [(r["k"], r["processes"]) for r in streams] == [(10, 1), (10, 2), (100, 1), (100, 2)]
    assert records[0]["measure"] == "server"
    backend = records[0]["backend"]
    calibrations = [r for r in records if r["measure"] == "calibration"]
    assert [c["k"] for c in calibrations] == [10, 100]
    for c in calibrations:
        for loop in ("select_1", "update_commit"):
            assert c[loop]["calls"] > 0 and c[loop]["per_s"] > 0, c
            assert c[loop]["client_cpu_ms"] >= 0
        # The servers run on this host: their CPU is read (PostgreSQL's backend process, a
        # MariaDB thread).
        if backend != "sqlite":
            assert c["server_cpu_readable"] and c["update_commit"]["server_cpu_ms"] is not None
    for r in streams:
        floor = next(c for c in calibrations if c["k"] == r["k"])["update_commit"]["per_s"]
        assert r["ratios"]["claims_per_s_x_floor"] == round(r["claims_per_s"] / floor, 2)
        assert r["claims"] > 0 and r["claims_per_s"] > 0
        assert r["misses"] == 0, r
        assert r["duplicates"] == 0, r
        assert r["violations"] == 0, r
        assert r["errors"] == 0, r
        assert r["database_agrees"], r
        assert r["background_jobs"] == 500
        # One commit claims each job; before it, every match request looks up its pilot's
        # record (a killed pilot gets nothing, taskqueue.pilots.pilotmatch._pilot_stop), a read-only
        # transaction of its own until the claim function does it (one per empty answer too).
        lookups = r["claims"] + r["empty_answers"]
        assert r["statements_per_claim"] >= 2
        expected = (r["claims"] + lookups) / r["claims"]
        if r["backend"] == "mariadb":
            # Its procedure hands back its rows alone: the stored payloads of the jobs it
            # claimed are read after it, one autocommit per call that got jobs (a claim the
            # procedure leaves to the Python path, at a race's end, reads them in its own
            # transaction): between none and one a claim.
            assert expected - 0.011 <= r["commits_per_claim"] <= expected + 1 + 0.011, r
        else:
            assert abs(r["commits_per_claim"] - expected) <= 0.011, r
        assert r["client_cpu_ms_per_claim"] > 0
        assert {"busy_cores", "other_cores", "loadavg_1m_before"} <= set(r["load"])
        # Every job the stream draws from is handed out: one claimer never answers "no match"
        # while work waits, and several lose at most a race at the very end.
        assert r["jobs_loaded"] == 300
        if r["processes"] == 1:
            assert r["jobs"] == 300 and r["empty_answers"] == 0
        else:
            assert r["jobs"] + r["empty_answers"] >= 300


def test_cpu_profile_is_written_and_split(tmp_path: Path) -> None:
    prefix = tmp_path / "profile"
    records = run_bench("--url", f"sqlite:///{tmp_path / 'p.db'}", "--jobs", "200", "--k", "10",
                        "--processes", "1", "--path", "claim_jobs", "--cpu-profile", str(prefix))
    stream = next(r for r in records if r["measure"] == "pilot_stream")
    assert stream["path"] == "claim_jobs" and stream["misses"] == 0
    share = stream["cpu_profile"]["share"]
    assert abs(sum(share.values()) - 1.0) < 0.01
    assert share.get("sqlalchemy_core", 0) > 0 and share.get("gridpilot", 0) > 0
    stats = pstats.Stats(stream["cpu_profile"]["file"])
    assert any(name == "claim_jobs" for _file, _line, name in stats.stats)  # type: ignore[attr-defined]


def test_refuses_conflicting_profiles(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--profile", "a", "--cpu-profile", "b"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "exclude each other" in done.stderr


def test_the_benchmarks_rules_agree_with_the_library(db: Database) -> None:
    """The benchmark judges claims by its own rules: for its workload they must say exactly
    what the library's matching says, pilot by pilot."""
    bench = bench_module()
    k = 60
    wl = bench.make_workload(k, 120, 3)
    tq_ids = bench.load(db.url, db.backend, bench.VO, bench.GROUP, k, wl.job_queue,
                        wl.priority)
    number = dict(zip(tq_ids, range(k), strict=True))
    specs = [bench.queue_spec(q) for q in range(k)]
    assert len({(s.owner, s.cpu_time, s.site, s.platform, s.tags) for s in specs}) == k
    rng = random.Random(5)
    with db.factory() as session:
        count = session.execute(text(f"SELECT count(*) FROM {task_queues_table.name}"))
        assert count.scalar_one() == k
        for _ in range(60):
            pilot = bench.pilot_for(specs[rng.randrange(k)], rng, 1)
            resource = parse_resource(pilot.data("p-1"))
            library = {number[c.tq_id] for c in matching_queues(session, resource)}
            ours = {q for q in range(k) if bench.matches(specs[q], pilot)}
            assert library == ours, pilot
            assert ours  # built compatible with a queue


def test_http_tiny_run_is_correct(tmp_path: Path) -> None:
    """The same stream over HTTP, against a real gunicorn matcher (SQLite here)."""
    records = run_bench("--url", f"sqlite:///{tmp_path / 'h.db'}", "--jobs", "120", "--k", "10",
                        "--http-only", "--clients", "2", "--http-counts", "1,4",
                        "--workers", "1")
    streams = [r for r in records if r["measure"] == "pilot_stream_http"]
    assert [(r["processes"], r["count"]) for r in streams] == [(2, 1), (2, 4)]
    for r in streams:
        assert (r["misses"], r["duplicates"], r["violations"], r["errors"]) == (0, 0, 0, 0), r
        assert r["database_agrees"] and r["jobs"] + r["empty_answers"] * r["count"] >= 120, r
        assert r["matcher_cpu_ms_per_claim"] > 0


def test_claim_function_path_is_one_call_and_correct(bench_url: str) -> None:
    """``--path claim_function``: the database's claim function alone, one statement per
    claim (and the payloads' read on MariaDB); refused (with a message, not a traceback)
    where there is no such function."""
    args = ("--url", bench_url, "--jobs", "200", "--k", "10", "--processes", "1",
            "--calibration-seconds", "0.3", "--path", "claim_function")
    if bench_url.startswith("sqlite"):
        done = subprocess.run([sys.executable, str(BENCH), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and "needs PostgreSQL or MariaDB" in done.stderr
        assert "Traceback" not in done.stderr
        return
    stream = next(r for r in run_bench(*args) if r["measure"] == "pilot_stream")
    assert stream["path"] == "claim_function" and stream["claims"] == 200
    assert (stream["misses"], stream["duplicates"], stream["violations"]) == (0, 0, 0)
    assert stream["jobs"] == 200 and stream["database_agrees"]
    # One call of the function; on MariaDB one more statement reads the claimed jobs'
    # stored payloads (its procedure hands back its rows alone).
    assert stream["statements_per_claim"] == (2.0 if stream["backend"] == "mariadb" else 1.0)
