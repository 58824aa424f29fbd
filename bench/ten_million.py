"""Ten million waiting jobs on PostgreSQL: the claim rate, a bulk submission, the dashboard
and one turn of every agent loop at that size.

A fresh database ``gp_tenm_<random>`` on the server ``--url`` names (dropped at the end unless
``--keep``) is migrated; the calibration of bench/calibration.py is measured on it (the
floor: a single-row UPDATE with a durable commit). Then:

1. the claimed workload: ``--base`` (default 100,000) waiting jobs of the VO ``benchvo`` over
   ``--k`` task queues, loaded by COPY as bench/pilot_stream.py loads them, and one claimer
   process claims from it through the matcher's path for ``--seconds`` (pilot_stream's
   ``measure``: misses, duplicates and violations checked);
2. the bulk: the other ``--jobs`` - ``--base`` waiting jobs, by COPY (pilot_stream's
   background loader), in the VO ``benchbg0`` over ``--queues`` task queues whose requirements
   spread over ``SITES_N`` (1,000) sites and ``TAGS_N`` (300) tags; load seconds and rows/s;
3. the claimed workload loaded afresh and measured again, now among ``--jobs`` waiting jobs;
   the ratio of the two rates (the target: at least 0.8);
4. one bulk submission of 1,000 jobs (a JSON list) through the matcher app's POST /api/v1/jobs
   in process (Flask test client), as bench/submit_inprocess.py sends it;
5. one turn of every agent loop (agents/runner.py's LOOP_NAMES, each as ``gridpilot agents``
   runs it, with ``[agents] vo`` the bulk's VO), its seconds (the target: at most 5 s) and,
   read from pg_stat_user_tables, the sequential scans of the jobs table it made (the
   activity loop may make none). The loops read conf/resources.toml, which serves none of the
   workload (the watchdog finds every waiting job unrunnable), or with ``--sites-served`` a
   generated file in which the 1,000 sites serve it; either way no CE names an Executor that
   could take the workload's pilots, so the director starts none;
6. each /ui/ page of bench/dashboard.py's list, as an operator of the bulk's VO (median of
   ``--repeat`` fetches after one warm-up; the target: at most 300 ms);
7. the disk (pg_database_size, the largest relations) and the server's memory (the RSS and,
   where readable, the PSS of every postgres process, from /proc).

One JSON line per measurement; rates carry their ratios to the floor. Run from the
repository root::

    .venv/bin/python bench/ten_million.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test

Quick: ``--jobs 20000 --base 5000``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import calibration as cal
import pilot_stream as ps
import queue_ops as tq
from dashboard import operator_client, pages
from kit import backend_of, emit, fresh_database, log, postgres_default, url_option
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

_HERE = Path(__file__).resolve().parent

ROOT = _HERE.parent
BULK_VO = "benchbg0"
SITES_N = 1000
TAGS_N = 300
SUBMIT_SECRET = "ten-million-benchmark-secret-0123456789"


def wide_spec(q: int) -> Any:
    """Queue ``q`` of the bulk: one of 1,000 sites (the four of pilot_stream among them), up to
    three of 300 tags; distinct for every q below 100,000 (site q % 1000, owner from q)."""
    site = ps.SITES[q % 1000] if q % 1000 < len(ps.SITES) else f"LCG.Site{q % 1000:03d}.org"
    owner = f"user{(q // 1000 + q) % 100}"
    tags = frozenset(f"tag{(q * 7 + j * 131) % TAGS_N:03d}" for j in range(q % 4))
    return ps.QueueSpec(owner=owner, cpu_time=ps.CPU_TIMES[q % 4], site=site,
                        platform=ps.PLATFORMS[q % 3], tags=tags)

def scalar(url: str, sql: str, **params: Any) -> Any:
    from taskqueue.db.database import make_engine

    engine = make_engine(url, statement_timeout=0)
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql), params).scalar()
    finally:
        engine.dispose()


def claims(url: str, backend: str, wl: Any, args: argparse.Namespace, label: str,
           calibration: dict[str, Any]) -> dict[str, Any]:
    """The claimed workload loaded afresh, then one claimer for ``--seconds``."""
    ps.load_workload(url, backend, wl)
    tq.analyze(url, backend, vacuum=True)
    job_ids = ps.job_ids_by_number(url, len(wl.job_queue))
    waiting = scalar(url, "SELECT count(*) FROM jobs WHERE status = 'Waiting'")
    record: dict[str, Any] = ps.measure(
        url, backend, wl, job_ids, processes=1, count=1, seed=args.seed, path="matcher",
        claims=len(wl.job_queue), seconds=args.seconds, profile=None)
    record["measure"] = f"claims_{label}"
    record["waiting_jobs_in_database"] = int(waiting)
    record["ratios"] = cal.ratios(record, calibration)
    emit(record)
    log(f"{label}: {record['claims_per_s']} claims/s among {waiting:,} waiting jobs, p50 "
        f"{record['p50_ms']} ms, p99 {record['p99_ms']} ms, misses {record['misses']}, "
        f"duplicates {record['duplicates']}, violations {record['violations']}")
    return record


def load_bulk(url: str, backend: str, args: argparse.Namespace, bulk: int) -> None:
    t0 = time.perf_counter()
    ps.ensure_background(url, backend, bulk, args.queues, args.seed, vos=(BULK_VO,),
                         spec_of=wide_spec)
    seconds = time.perf_counter() - t0
    # As autovacuum would (it is off here): the claimed workload's reload plans its removal
    # with the statistics of a database a hundredth of this size otherwise.
    tq.analyze(url, backend, vacuum=False)
    counts = {
        "sites": scalar(url, "SELECT count(DISTINCT value) FROM tq_sites s JOIN task_queues q "
                        "ON q.id = s.tq_id WHERE q.vo = :vo", vo=BULK_VO),
        "tags": scalar(url, "SELECT count(DISTINCT value) FROM tq_tags s JOIN task_queues q "
                       "ON q.id = s.tq_id WHERE q.vo = :vo", vo=BULK_VO),
        "queues": scalar(url, "SELECT count(*) FROM task_queues WHERE vo = :vo", vo=BULK_VO),
    }
    # Each job is three rows more: its history (three) and its task_queue_jobs row.
    emit({"measure": "load", "method": "COPY", "jobs": bulk, "vo": BULK_VO, **counts,
          "seconds": round(seconds, 1), "jobs_per_s": round(bulk / seconds) if seconds else None,
          "rows_per_s": round(5 * bulk / seconds) if seconds else None,
          "rows_per_job": 5, "waiting_jobs_in_database": int(scalar(
              url, "SELECT count(*) FROM jobs WHERE status = 'Waiting'"))})


def bulk_submission(url: str, calibration: dict[str, Any], tmp: Path) -> None:
    """1,000 jobs in one POST /api/v1/jobs through the matcher app, in process."""
    from gridpilot.server import worker_app
    from matcher.auth import issue_token
    from matcher.runtime import runtime_of
    from taskqueue.core.settings import load_settings

    settings = load_settings(None, {
        "GRIDPILOT_DATABASE_URL": url, "GRIDPILOT_AUTH_SECRET": SUBMIT_SECRET,
        "GRIDPILOT_RESOURCES_FILE": str(ROOT / "conf" / "resources.toml"),
        "GRIDPILOT_MATCHER_METRICS_DIR": str(tmp / "metrics")})
    app = worker_app(settings)
    client = app.test_client()
    token = issue_token(SUBMIT_SECRET, subject="bench", role="user", vo="lhcb",
                        group="lhcb_user", lifetime=3600)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    n = 1000
    body = json.dumps([{"executable": "/bin/true", "arguments": [str(i)]} for i in range(n)],
                      separators=(",", ":"))
    try:
        warm = client.post("/api/v1/jobs", data=json.dumps([{"executable": "/bin/true"}]),
                           headers=headers)
        t0 = time.perf_counter()
        answer = client.post("/api/v1/jobs", data=body, headers=headers)
        seconds = time.perf_counter() - t0
    finally:
        runtime_of(app).dispose()
    floor = calibration["update_commit"]["per_s"]
    emit({"measure": "bulk_submission", "jobs": n, "status": answer.status_code,
          "warm_up_status": warm.status_code, "seconds": round(seconds, 3),
          "jobs_per_s": round(n / seconds, 1),
          "ratios": {"jobs_per_s_x_floor": round(n / seconds / floor, 2) if floor else None,
                     "seconds_x_floor_call": round(seconds * floor, 1)}})


def jobs_scans(url: str) -> tuple[int, int]:
    """Sequential scans of the jobs table, and the rows they read, so far."""
    row = None
    from taskqueue.db.database import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT seq_scan, seq_tup_read FROM pg_stat_user_tables "
                                    "WHERE relname = 'jobs'")).one()
    finally:
        engine.dispose()
    return int(row[0]), int(row[1])


def sites_file(tmp: Path) -> Path:
    """A resources file in which each of the bulk's 1,000 sites serves the bulk's VO, the
    claimed one and lhcb (the bulk submission's) with every platform, tag and CPU time of the
    workload, through one CE that names no Executor (so the director starts no pilot). The
    queues differ as a grid's do, in CPU time (3 values), processors (2) and memory (4): 24
    distinct descriptions per VO, each matched once in the agents' one pass
    (taskqueue.matching.reach)."""
    tags = sorted({*ps.ALL_TAGS, *(f"tag{t:03d}" for t in range(TAGS_N))})
    lines = []
    for n in range(SITES_N):
        site = ps.SITES[n] if n < len(ps.SITES) else f"LCG.Site{n:03d}.org"
        lines += [f'[Sites."{site}"]', f'VO = ["{BULK_VO}", "{ps.VO}", "lhcb"]', "HS06 = 1.0",
                  'Platform = ["EL9", "EL8"]', f"Tags = {json.dumps(tags)}",
                  f'[Sites."{site}".CEs."ce{n:03d}.bench"]',
                  f'[Sites."{site}".CEs."ce{n:03d}.bench".Queues.long]',
                  f"MaxCPUTime = {max(ps.CPU_TIMES) // 60 + 60 * (1 + n % 3)}",
                  f"NumberOfProcessors = {1 + 3 * (n % 2)}", f"MaxRAM = {8192 + 1024 * (n % 4)}",
                  ""]
    path = tmp / "sites.toml"
    path.write_text("\n".join(lines))
    return path


def agent_turns(url: str, tmp: Path, target: float, resources: Path) -> None:
    """One turn of every loop of ``gridpilot agents``, each in its own engine (closed after,
    so that its backends' statistics reach pg_stat_user_tables)."""
    from agents.context import AgentContext
    from agents.runner import LOOP_NAMES, Agents
    from taskqueue.core.settings import Settings
    from taskqueue.db.database import make_engine, make_session_factory

    base = Settings()
    settings = replace(base, database=replace(base.database, url=url),
                       auth=replace(base.auth, secret=SUBMIT_SECRET),
                       resources=replace(base.resources, file=str(resources)),
                       agents=replace(base.agents, vo=BULK_VO,
                                      pilot_workdir=str(tmp / "pilots")))
    for name in LOOP_NAMES:
        engine = make_engine(url)
        runner = Agents(AgentContext(settings, make_session_factory(engine),
                                     secret=SUBMIT_SECRET), [name])
        scans0, rows0 = jobs_scans(url)
        t0 = time.perf_counter()
        summary = runner.run_once()[name]
        seconds = time.perf_counter() - t0
        engine.dispose()
        time.sleep(0.5)  # the backends' statistics are written as they exit
        scans1, rows1 = jobs_scans(url)
        emit({"measure": "agent_turn", "loop": name, "seconds": round(seconds, 3),
              "target_s": target, "met": seconds <= target,
              "jobs_seq_scans": scans1 - scans0, "jobs_seq_rows_read": rows1 - rows0,
              "summary": summary})
        log(f"agent loop {name}: {seconds:.2f} s: {summary}")


def dashboard_pages(url: str, repeat: int, target_ms: float) -> None:
    """bench/dashboard.py's pages, as an operator of the bulk's VO."""
    engine = create_engine(make_url(url))
    with engine.connect() as conn:
        first_tq = conn.execute(text("SELECT min(id) FROM task_queues WHERE vo = :vo"),
                                {"vo": BULK_VO}).scalar_one()
        last_job = conn.execute(text("SELECT max(id) FROM jobs WHERE vo = :vo"),
                                {"vo": BULK_VO}).scalar_one()
        conn.execute(text(
            "INSERT INTO pilots (reference, vo, site, ce, queue, status, submitted_at, "
            "last_seen_at, executor, native_id, reason, updated_at) VALUES ('tenm-pilot-1', "
            ":vo, 'LCG.CNAF.it', 'ce01-htc.cr.cnaf.infn.it', 'htc', 'Running', "
            "timezone('UTC', now()), timezone('UTC', now()), 'slurm', '1', '', "
            "timezone('UTC', now()))"), {"vo": BULK_VO})
        conn.commit()
    engine.dispose()
    client, runtime = operator_client(url, BULK_VO)
    try:
        for name, path in pages(first_tq, last_job, last_job, "tenm-pilot-1"):
            times, statuses = [], []
            for i in range(repeat + 1):
                t0 = time.perf_counter()
                response = client.get(path)
                response.get_data()
                statuses.append(response.status_code)
                if i:  # the first fetch warms the caches
                    times.append(1000 * (time.perf_counter() - t0))
            median = statistics.median(times)
            emit({"measure": "page", "page": name, "path": path,
                  "status": max(set(statuses), key=statuses.count),
                  "all_200": all(s == 200 for s in statuses), "median_ms": round(median, 1),
                  "worst_ms": round(max(times), 1), "target_ms": target_ms,
                  "met": median <= target_ms})
    finally:
        runtime.dispose()


def disk_and_memory(url: str) -> None:
    from taskqueue.db.database import make_engine

    engine = make_engine(url, statement_timeout=0)
    try:
        with engine.connect() as conn:
            size = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
            largest = [{"relation": r[0], "mb": round(r[1] / 2**20, 1)} for r in conn.execute(text(
                "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN "
                "pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND "
                "c.relkind = 'r' ORDER BY 2 DESC LIMIT 8"))]
            indexes = [{"index": r[0], "mb": round(r[1] / 2**20, 1)} for r in conn.execute(text(
                "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'i' "
                "ORDER BY 2 DESC LIMIT 8"))]
            jobs = conn.execute(text("SELECT count(*) FROM jobs")).scalar_one()
            shared = conn.execute(text("SHOW shared_buffers")).scalar_one()
    finally:
        engine.dispose()
    emit({"measure": "disk", "database_mb": round(size / 2**20, 1), "jobs": jobs,
          "bytes_per_job": round(size / jobs) if jobs else None,
          "largest_tables_with_indexes": largest, "largest_indexes": indexes})
    rss = pss = 0
    readable = 0
    pids = ps.pids_named("postgres")
    for pid in pids:
        for path, key in ((f"/proc/{pid}/status", "VmRSS:"), (f"/proc/{pid}/smaps_rollup",
                                                               "Pss:")):
            try:
                lines = Path(path).read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                if line.startswith(key):
                    kb = int(line.split()[1])
                    if key == "VmRSS:":
                        rss += kb
                    else:
                        pss += kb
                        readable += 1
    emit({"measure": "server_memory", "postgres_processes": len(pids),
          "rss_mb_sum": round(rss / 1024, 1),
          "pss_mb_sum": round(pss / 1024, 1) if readable else None,
          "pss_processes_read": readable,
          "shared_buffers": shared,
          "note": "RSS counts the shared buffers once per process that touched them; PSS "
                  "shares them out"})


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    url_option(parser, postgres_default())
    parser.add_argument("--jobs", type=int, default=10_000_000,
                        help="waiting jobs in all (default 10000000)")
    parser.add_argument("--base", type=int, default=100_000,
                        help="waiting jobs of the claimed workload, and of the first claim "
                             "measurement (default 100000)")
    parser.add_argument("--k", type=int, default=1000,
                        help="task queues of the claimed workload (default 1000)")
    parser.add_argument("--queues", type=int, default=10_000,
                        help="task queues of the bulk (default 10000)")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="seconds of each claim measurement (default 30)")
    parser.add_argument("--repeat", type=int, default=5, help="timed fetches per page")
    parser.add_argument("--target-ms", type=float, default=300.0)
    parser.add_argument("--turn-target", type=float, default=5.0,
                        help="seconds one agent loop's turn may take (default 5)")
    parser.add_argument("--sites-served", action="store_true",
                        help="the agent loops read a resources file in which the 1,000 sites "
                             "serve the workload (CEs without an Executor: no pilot is "
                             "started); default conf/resources.toml, which serves none of it")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args(argv)
    if backend_of(args.url) != "postgresql":
        parser.error("--url must name a PostgreSQL server (COPY, pg_stat_user_tables)")
    if min(args.jobs, args.base, args.k, args.queues, args.repeat) < 1 or args.seconds <= 0:
        parser.error("--jobs, --base, --k, --queues, --repeat and --seconds must be positive")
    if args.base >= args.jobs:
        parser.error("--base must be below --jobs")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    started = time.perf_counter()
    emit({"measure": "machine", "cpus": os.cpu_count(), "loadavg_before": os.getloadavg()})
    with tempfile.TemporaryDirectory(prefix="gp_tenm_") as tmpdir, \
            fresh_database(args.url, prefix="gp_tenm", keep=args.keep) as db:
        url, backend = db.url, "postgresql"
        emit(tq.server_info(url, backend))
        calibration = cal.calibrate(url, backend)
        emit(calibration)
        wl = ps.make_workload(args.k, args.base, args.seed)
        small = claims(url, backend, wl, args, "at_base", calibration)
        load_bulk(url, backend, args, args.jobs - args.base)
        full = claims(url, backend, wl, args, "at_full_size", calibration)
        ratio = (round(full["claims_per_s"] / small["claims_per_s"], 2)
                 if small["claims_per_s"] else None)
        emit({"measure": "claim_rate_ratio", "base_waiting": small["waiting_jobs_in_database"],
              "full_waiting": full["waiting_jobs_in_database"],
              "claims_per_s_base": small["claims_per_s"],
              "claims_per_s_full": full["claims_per_s"], "full_x_base": ratio,
              "target": 0.8, "met": ratio is not None and ratio >= 0.8})
        bulk_submission(url, calibration, Path(tmpdir))
        agent_turns(url, Path(tmpdir), args.turn_target,
                    sites_file(Path(tmpdir)) if args.sites_served else
                    ROOT / "conf" / "resources.toml")
        tq.analyze(url, backend, vacuum=False)
        dashboard_pages(url, args.repeat, args.target_ms)
        disk_and_memory(url)
    emit({"measure": "machine", "loadavg_after": os.getloadavg(),
          "seconds": round(time.perf_counter() - started, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
