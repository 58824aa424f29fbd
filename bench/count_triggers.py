"""What PostgreSQL's job-count triggers (migration 0028 and after) cost a claim, a heartbeat
and a bulk status change, for several ways of keeping the counts, side by side in one run.

Each VARIANT is a set of triggers on ``jobs`` and ``task_queue_jobs`` (the functions of all of
them are made once, in a fresh database built to the alembic head): ``statement``, the
statement triggers with transition tables of 0028; ``none``, no trigger for UPDATE of jobs (the
lower bound: such counts would be wrong); ``row``, a row trigger ``AFTER UPDATE OF status, vo``
whose ``WHEN`` lets only a changed status or VO call PL/pgSQL (the statement trigger stays for
INSERT); ``row_tq``, ``row`` with row triggers for task_queue_jobs' DELETE too; ``row_noop``
and ``row_half`` split a row trigger's cost (its call alone, one delta row; their counts are
wrong). The workload is bench/pilot_stream.py's (``--claims`` per variant + 200 waiting jobs in
``--k`` queues of VO ``benchvo``) plus ``--bulk`` waiting jobs of VO ``benchbulk``, loaded
afresh each round. In each round the variants take turns, ``--block`` claims each, the order
rotating; before its block a variant's triggers replace the others' (on another connection, in
one transaction) and the deltas are emptied. Per block a variant also runs ``--beats``
heartbeats (taskqueue.pilots.pilotreports' UPDATE, each its own commit) on jobs claimed in the
warm-up, and one bulk kill (the ``--bulk`` jobs' status UPDATE and their task_queue_jobs DELETE
in one transaction, rolled back so that every block kills the same jobs).

One JSON line per variant and round: the backend's CPU (from /proc) per claim, per heartbeat
and per bulk kill, each as a multiple of the calibration UPDATE's (bench/calibration.py,
measured at the start of the round) and of the first variant's figure.

    .venv/bin/python bench/count_triggers.py \\
        --url postgresql+psycopg://postgres@127.0.0.1:5432/test --rounds 3
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pilot_stream as ps
import queue_ops
from calibration import calibrate
from kit import backend_of, fresh_database, process_cpu

WARM_UP = 50
BULK_VO = "benchbulk"

_FUNCTIONS = (
    # 0028's statement function: since migration 0041 the installed
    # gridpilot_count_changed_jobs() is the row trigger's, so the variant brings its own.
    """CREATE OR REPLACE FUNCTION gp_bench_count_changed_jobs() RETURNS trigger
    LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO job_count_deltas (vo, status, jobs)
    SELECT vo, status, sum(n) FROM (
        SELECT vo, status, 1 AS n FROM gridpilot_new_jobs
        UNION ALL SELECT vo, status, -1 FROM gridpilot_old_jobs) AS changed
    GROUP BY vo, status HAVING sum(n) <> 0;
    RETURN NULL;
END $fn$""",
    """CREATE OR REPLACE FUNCTION gp_bench_count_job_status() RETURNS trigger
    LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO job_count_deltas (vo, status, jobs)
    VALUES (OLD.vo, OLD.status, -1), (NEW.vo, NEW.status, 1);
    RETURN NULL;
END $fn$""",
    """CREATE OR REPLACE FUNCTION gp_bench_count_nothing() RETURNS trigger
    LANGUAGE plpgsql AS $fn$
BEGIN
    RETURN NULL;
END $fn$""",
    """CREATE OR REPLACE FUNCTION gp_bench_count_half() RETURNS trigger
    LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO job_count_deltas (vo, status, jobs) VALUES (NEW.vo, NEW.status, 1);
    RETURN NULL;
END $fn$""",
    """CREATE OR REPLACE FUNCTION gp_bench_count_unqueued_job() RETURNS trigger
    LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO tq_waiting_deltas (tq_id, jobs) VALUES (OLD.tq_id, -1);
    RETURN NULL;
END $fn$""",
)
#: Every trigger any variant makes, with its table.
_ALL = (("gridpilot_count_changed_jobs", "jobs"), ("gp_bench_count_job_status", "jobs"),
        ("gp_bench_count_nothing", "jobs"), ("gp_bench_count_half", "jobs"),
        ("gridpilot_count_unqueued_jobs", "task_queue_jobs"),
        ("gp_bench_count_unqueued_job", "task_queue_jobs"))
_STATEMENT_UPDATE = """CREATE TRIGGER gridpilot_count_changed_jobs AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS gridpilot_old_jobs NEW TABLE AS gridpilot_new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION gp_bench_count_changed_jobs()"""
_STATEMENT_DELETE = """CREATE TRIGGER gridpilot_count_unqueued_jobs AFTER DELETE
    ON task_queue_jobs REFERENCING OLD TABLE AS gridpilot_unqueued
    FOR EACH STATEMENT EXECUTE FUNCTION gridpilot_count_unqueued_jobs()"""
_ROW_UPDATE = """CREATE TRIGGER gp_bench_count_job_status AFTER UPDATE OF status, vo ON jobs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.vo IS DISTINCT FROM NEW.vo)
    EXECUTE FUNCTION gp_bench_count_job_status()"""
_ROW_NOOP = _ROW_UPDATE.replace("gp_bench_count_job_status", "gp_bench_count_nothing")
_ROW_HALF = _ROW_UPDATE.replace("gp_bench_count_job_status", "gp_bench_count_half")
_ROW_DELETE = """CREATE TRIGGER gp_bench_count_unqueued_job AFTER DELETE ON task_queue_jobs
    FOR EACH ROW EXECUTE FUNCTION gp_bench_count_unqueued_job()"""
VARIANTS: dict[str, tuple[str, ...]] = {
    "statement": (_STATEMENT_UPDATE, _STATEMENT_DELETE),
    "none": (_STATEMENT_DELETE,),
    "row": (_ROW_UPDATE, _STATEMENT_DELETE),
    "row_tq": (_ROW_UPDATE, _ROW_DELETE),
    # What a row trigger's parts cost (their counts are wrong): the call alone, one row.
    "row_noop": (_ROW_NOOP, _STATEMENT_DELETE),
    "row_half": (_ROW_HALF, _STATEMENT_DELETE),
}


def _install(conn: Any, variant: str) -> None:
    """The variant's triggers in place of any other's, the deltas emptied (one transaction)."""
    with conn.transaction():
        for name, table in _ALL:
            conn.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        for statement in VARIANTS[variant]:
            conn.execute(statement)
        conn.execute("TRUNCATE job_count_deltas, tq_waiting_deltas")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("variants", nargs="*", default=list(VARIANTS),
                        help="variants, the first the reference (default: "
                        f"{' '.join(VARIANTS)})")
    parser.add_argument("--url", required=True, help="a PostgreSQL server on this host (a "
                        "fresh database is made there and dropped at the end)")
    parser.add_argument("--k", type=int, default=1000, help="task queues (default 1000)")
    parser.add_argument("--claims", type=int, default=1000,
                        help="claims per variant and round (default 1000)")
    parser.add_argument("--block", type=int, default=50, help="claims per turn (default 50)")
    parser.add_argument("--beats", type=int, default=200,
                        help="heartbeats per turn (default 200)")
    parser.add_argument("--bulk", type=int, default=1000,
                        help="jobs of the bulk kill (default 1000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or min(args.k, args.rounds, args.block, args.beats, args.bulk) < 1:
        parser.error(f"unknown variants {unknown}, or a count below 1")
    if backend_of(args.url) != "postgresql":
        raise SystemExit("bench/count_triggers.py measures PostgreSQL's triggers only")
    with fresh_database(args.url, prefix="gp_bench_counts") as db:
        for rnd in range(args.rounds):
            _round(args, rnd, db.url)
    return 0


def _round(args: argparse.Namespace, rnd: int, url: str) -> None:
    import psycopg
    from sqlalchemy.dialects import postgresql

    from taskqueue.core.resources import parse_resource
    from taskqueue.pilots.pilotmatch import _CALL, _parameters
    from taskqueue.pilots.pilotreports import _BEAT

    calibration = calibrate(url, "postgresql")
    floor_ms = calibration["update_commit"]["server_cpu_ms"]
    print(json.dumps({**calibration, "round": rnd}), flush=True)
    names: list[str] = args.variants
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    admin = psycopg.connect(dsn, autocommit=True)
    for statement in _FUNCTIONS:
        admin.execute(statement)
    _install(admin, "statement")  # the load's counts as 0028 keeps them
    wl = ps.make_workload(args.k, args.claims * len(names) + 200, 1)
    ps.load_workload(url, "postgresql", wl)
    ps.clear_vos(url, [BULK_VO])
    bulk = ps.make_workload(10, args.bulk, 2)
    ps.load(url, "postgresql", BULK_VO, f"{BULK_VO}_user", bulk.k, bulk.job_queue,
            bulk.priority)
    queue_ops.analyze(url, "postgresql", vacuum=True)
    row = admin.execute("SELECT array_agg(id) FROM jobs WHERE vo = %s", (BULK_VO,)).fetchone()
    assert row is not None
    bulk_ids: list[int] = list(row[0])
    rng = random.Random(7 + rnd)
    order = list(range(len(wl.job_queue)))
    rng.shuffle(order)
    calls = []
    for i in order[:args.claims * len(names) + WARM_UP]:
        pilot = ps.pilot_for(ps.queue_spec(wl.job_queue[i]), rng, 1)
        calls.append(_parameters(parse_resource(pilot.data(f"ab-{i}")), now=datetime.now(UTC),
                                 count=1, rng=random.Random(i), with_expressions=True))
    beat_sql = str(_BEAT.compile(dialect=postgresql.dialect(),  # type: ignore[no-untyped-call]
                                 compile_kwargs={"render_postcompile": True}))
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        cur = conn.cursor()
        row = cur.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = int(row[0])
        queue = iter(calls)
        beaten: list[int] = []
        for _ in range(WARM_UP):
            beaten += [r[1] for r in cur.execute(_CALL, next(queue)).fetchall()
                       if r[0] == "job"]
        spent = {name: {"claim": 0.0, "beat": 0.0, "bulk": 0.0} for name in names}
        done = {name: {"claim": 0, "beat": 0, "bulk": 0} for name in names}
        jobs = dict.fromkeys(names, 0)
        block = 0
        while True:
            batch = [c for _, c in zip(range(args.block * len(names)), queue, strict=False)]
            if not batch:
                break
            for turn in range(len(names)):
                name = names[(turn + block) % len(names)]
                part = batch[turn * args.block:(turn + 1) * args.block]
                if not part:
                    continue
                _install(admin, name)
                cpu0 = sum(process_cpu(pid))
                for params in part:
                    jobs[name] += len(cur.execute(_CALL, params).fetchall())
                cpu1 = sum(process_cpu(pid))
                for b in range(args.beats):
                    at = datetime.now(UTC).replace(tzinfo=None)  # the column's naive UTC
                    cur.execute(beat_sql, {"b_id": beaten[b % len(beaten)], "b_at": at,
                                           "b_cpu": float(b), "b_progress": None,
                                           "b_tail": None})
                cpu2 = sum(process_cpu(pid))
                cur.execute("BEGIN")
                killed = cur.execute(
                    "UPDATE jobs SET status = 'Killed', minor_status = 'Killed by bench' "
                    "WHERE id = ANY(%s) AND status = 'Waiting'", (bulk_ids,)).rowcount
                cur.execute("DELETE FROM task_queue_jobs WHERE job_id = ANY(%s)", (bulk_ids,))
                cur.execute("ROLLBACK")
                cpu3 = sum(process_cpu(pid))
                assert killed == len(bulk_ids), killed
                spent[name]["claim"] += cpu1 - cpu0
                spent[name]["beat"] += cpu2 - cpu1
                spent[name]["bulk"] += cpu3 - cpu2
                done[name]["claim"] += len(part)
                done[name]["beat"] += args.beats
                done[name]["bulk"] += 1
            block += 1
    finally:
        conn.close()
        _install(admin, "statement")
        admin.close()
    first: dict[str, float] = {}
    for name in names:
        record: dict[str, Any] = {"measure": "count_triggers", "round": rnd, "variant": name,
                                  "k": args.k, "claims": done[name]["claim"],
                                  "jobs": jobs[name], "beats": done[name]["beat"],
                                  "bulk_kills": done[name]["bulk"], "bulk_jobs": args.bulk}
        for what in ("claim", "beat", "bulk"):
            ms = spent[name][what] * 1000 / max(done[name][what], 1)
            first.setdefault(what, ms)
            record[f"server_cpu_ms_per_{what}"] = round(ms, 3)
            record[f"{what}_x_calibration"] = round(ms / floor_ms, 2) if floor_ms else None
            record[f"{what}_x_first"] = round(ms / first[what], 3) if first[what] else None
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
