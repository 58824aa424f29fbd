"""Purge benchmark: the claim latency with and without a purge of N ended jobs running.

The database (``--url``, default an SQLite file in a temporary folder) gets the pilot-stream
workload of bench/pilot_stream.py (``--jobs`` waiting jobs over ``--k`` task queues, VO
``benchvo``) and ``--ended`` jobs of the VO ``benchpurge`` that ended 40 days ago as Done, each
with five status-history rows (COPY on PostgreSQL, bulk INSERT elsewhere). Then, twice, one
claimer process claims through the matcher's path for ``--seconds`` (the stream of
bench/pilot_stream.py, workload loaded afresh each time):

1. alone: the baseline;
2. while the purge loop (agents/purge.py, ``[purge]`` defaults, ``--batch`` jobs per
   transaction) removes the ended jobs in a process of its own, started with the claims'
   clock; the claims stop when the purge ends (or after ``--seconds``), so that every claim
   of this measurement met the purge.

Printed, one JSON line each: the calibration of the same run (bench/calibration.py), the two
claim measurements (with their ratios to the floor), and the purge: jobs removed, its seconds
and rate, whether it overlapped the whole claim window, and the claim p99 with the purge as a
multiple of the p99 without (the target: at most 1.5). At the purge's rate, ``seconds_for_
1000000`` extrapolates to a million ended jobs. Run from the repository root::

    .venv/bin/python bench/purge.py --url postgresql+psycopg://postgres@127.0.0.1:5432/x \\
        --ended 100000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import calibration as cal
import pilot_stream as ps
import queue_ops as tq
from kit import backend_of, emit, log, upgrade_schema

PURGE_VO = "benchpurge"
PURGE_GROUP = "benchpurge_user"
HISTORY = (("Received", "Job accepted", "submit"), ("Checking", "Job sanity", "bench"),
           ("Waiting", "Pilot Agent Submission", "optimizer"),
           ("Matched", "Assigned", "matcher"), ("Done", "Execution Complete", "pilot"))


def load_ended(url: str, backend: str, n: int, *, chunk: int = 20_000) -> float:
    """``n`` jobs of ``benchpurge`` that ended as Done 40 days ago, with their history."""
    from sqlalchemy import insert

    from taskqueue.db.database import make_engine, make_session_factory
    from taskqueue.db.models import history_table, jobs_table

    ps.clear_vos(url, [PURGE_VO])
    now = datetime.now(UTC)
    ended = now - timedelta(days=40)
    t0 = time.perf_counter()
    engine = make_engine(url)
    factory = make_session_factory(engine)

    def row(i: int) -> dict[str, Any]:
        r: dict[str, Any] = ps.job_row(PURGE_VO, PURGE_GROUP, i, ps.queue_spec(i), 1,
                                        ended - timedelta(hours=1))
        r.update(status="Done", minor_status="Execution Complete", ended_at=ended)
        return r

    try:
        for lo in range(0, n, chunk):
            numbers = range(lo, min(lo + chunk, n))
            with factory.begin() as session:
                conn = session.connection()
                if backend == "postgresql":
                    _copy(conn, [row(i) for i in numbers], ended)
                    continue
                ids = list(conn.execute(
                    insert(jobs_table).returning(jobs_table.c.id, sort_by_parameter_order=True),
                    [row(i) for i in numbers]).scalars())
                conn.execute(insert(history_table), [
                    {"job_id": jid, "at": ended, "status": s, "minor_status": m, "source": src}
                    for jid in ids for s, m, src in HISTORY])
    finally:
        engine.dispose()
    return time.perf_counter() - t0


def _copy(conn: Any, rows: list[dict[str, Any]], ended: datetime) -> None:
    from sqlalchemy import text

    n = len(rows)
    last = conn.execute(text("SELECT setval(pg_get_serial_sequence('jobs', 'id'), "
                             "nextval(pg_get_serial_sequence('jobs', 'id')) + :n - 1)"),
                        {"n": n}).scalar_one()
    ids = range(last - n + 1, last + 1)
    naive = {k: v.astimezone(UTC).replace(tzinfo=None) if isinstance(v, datetime) else v
             for k, v in rows[0].items()}
    columns = ["id", *naive]
    at = ended.astimezone(UTC).replace(tzinfo=None)
    raw: Any = conn.connection.driver_connection
    with raw.cursor() as cur:
        with cur.copy(f"COPY jobs ({', '.join(columns)}) FROM STDIN") as copy:
            for jid, r in zip(ids, rows, strict=True):
                values = {k: v.astimezone(UTC).replace(tzinfo=None)
                          if isinstance(v, datetime) else v for k, v in r.items()}
                values["id"] = jid
                copy.write_row([values[c] for c in columns])
        tq.copy_history(cur, ids, at, HISTORY)


def vacuum(url: str, backend: str) -> None:
    """VACUUM (PostgreSQL) without a statement timeout: a purge leaves millions of dead rows
    that a test server without autovacuum keeps, and the next run's timed VACUUM ANALYZE
    would not get through them in time."""
    if backend != "postgresql":
        return
    from sqlalchemy import text

    from taskqueue.db.database import make_engine

    engine = make_engine(url, statement_timeout=0)
    try:
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM"))
    finally:
        engine.dispose()


def ended_left(url: str) -> int:
    from sqlalchemy import func, select

    from taskqueue.db.database import make_engine
    from taskqueue.db.models import jobs_table

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(jobs_table).where(
                jobs_table.c.vo == PURGE_VO)).scalar_one())
    finally:
        engine.dispose()


def purger(url: str, batch: int, pause: float, started: Any, go: Any, stop: Any,
           done: Any) -> None:
    """The purge loop's turn, in a process of its own, from the claims' start (``go``);
    its seconds go to ``done``, and ``stop`` ends the claims with it."""
    from dataclasses import replace

    from agents.context import AgentContext
    from agents.purge import purge_ended_jobs
    from taskqueue.core.settings import Settings
    from taskqueue.db.database import make_engine, make_session_factory

    base = Settings()
    settings = replace(base, database=replace(base.database, url=url),
                       purge=replace(base.purge, batch=batch, pause=pause))
    engine = make_engine(url)
    ctx = AgentContext(settings, make_session_factory(engine))
    started.set()
    go.wait()
    t0 = time.perf_counter()
    summary = purge_ended_jobs(ctx)
    took = time.perf_counter() - t0
    stop.value = 1
    done.put((took, summary))
    engine.dispose()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", default=None, help="SQLAlchemy URL of a database the "
                        "benchmark may write its own VOs into (default: an SQLite file)")
    parser.add_argument("--ended", type=int, default=100_000,
                        help="ended jobs to purge (default 100000)")
    parser.add_argument("--jobs", type=int, default=20_000,
                        help="waiting jobs the claimer draws from (default 20000)")
    parser.add_argument("--k", type=int, default=100, help="task queues (default 100)")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="seconds of each claim measurement (default 30)")
    parser.add_argument("--batch", type=int, default=500,
                        help="jobs per purge transaction (default 500, [purge] batch)")
    parser.add_argument("--pause", type=float, default=0.0,
                        help="seconds between two purge batches (default 0, [purge] pause)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if min(args.ended, args.jobs, args.k, args.batch) < 1 or args.seconds <= 0:
        parser.error("--ended, --jobs, --k, --batch and --seconds must be positive")
    if args.pause < 0:
        parser.error("--pause must not be negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    tmpdir = Path(tempfile.mkdtemp(prefix="gp_purge_"))
    url = args.url or f"sqlite:///{tmpdir / 'purge.db'}"
    backend = backend_of(url)
    try:
        upgrade_schema(url)
        emit(tq.server_info(url, backend))
        vacuum(url, backend)
        calibration = cal.calibrate(url, backend)
        emit(calibration)
        wl = ps.make_workload(args.k, args.jobs, args.seed)
        records = {}
        purge: dict[str, Any] = {}
        for mode in ("without_purge", "with_purge"):
            ps.load_workload(url, backend, wl)
            if mode == "with_purge":
                seconds = load_ended(url, backend, args.ended)
                log(f"loaded {args.ended:,} ended jobs in {seconds:.1f} s")
            tq.analyze(url, backend, vacuum=True)
            job_ids = ps.job_ids_by_number(url, len(wl.job_queue))
            ctx = mp.get_context("spawn")
            proc = None
            done = ctx.Queue()
            stop, go = ctx.Value("i", 0), ctx.Event()
            if mode == "with_purge":
                started = ctx.Event()
                proc = ctx.Process(target=purger,
                                   args=(url, args.batch, args.pause, started, go, stop,
                                         done))
                proc.start()
                started.wait(120)
            t0 = time.perf_counter()
            # With the purge, the claims run exactly as long as it does (at most --seconds).
            record = ps.measure(url, backend, wl, job_ids, processes=1, count=1,
                                seed=args.seed, path="matcher", claims=len(wl.job_queue),
                                seconds=args.seconds, profile=None, stop=stop, on_start=go)
            window = time.perf_counter() - t0
            record["measure"] = f"claims_{mode}"
            record["ratios"] = cal.ratios(record, calibration)
            records[mode] = record
            emit(record)
            log(f"{mode}: {record['claims_per_s']} claims/s, p50 {record['p50_ms']} ms, "
                   f"p99 {record['p99_ms']} ms, misses {record['misses']}, duplicates "
                   f"{record['duplicates']}, violations {record['violations']}")
            if proc is not None:
                took, summary = done.get(timeout=7200)
                proc.join(60)
                left = ended_left(url)
                removed = args.ended - left
                purge = {"measure": "purge", "backend": backend, "ended": args.ended,
                         "removed": removed, "left": left, "batch": args.batch,
                         "pause": args.pause,
                         "seconds": round(took, 2),
                         "jobs_per_s": round(removed / took, 1) if took else None,
                         # The claims stop with the purge: false when they ran out first.
                         "overlapped_whole_claim_window": took <= window + 1,
                         "claim_window_seconds": round(window, 2), "summary": summary}
                if purge["jobs_per_s"]:
                    purge["seconds_for_1000000"] = round(1_000_000 / purge["jobs_per_s"])
        base, during = records["without_purge"]["p99_ms"], records["with_purge"]["p99_ms"]
        purge["claim_p99_ms_without"] = base
        purge["claim_p99_ms_with"] = during
        purge["claim_p99_with_x_without"] = round(during / base, 2) if base else None
        emit(purge)
        log(f"purge: {purge}")
        ps.clear_vos(url, [ps.VO, PURGE_VO])
        vacuum(url, backend)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
