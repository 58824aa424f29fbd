"""Scratch measurement (PostgreSQL): how fast is a claim done in ONE round trip?

Not wired into the service. A prototype PL/pgSQL function, ``gp_scratch_claim``, does what a
claim does (draw the first matching active queue in draw order, take its best unlocked job,
advance the queue's clock, move the job Waiting -> Matched with the pilot's reference, site and
CE, write the history row, return the payload columns), called with bound parameters on a bare
psycopg connection in autocommit (a prepared statement: one round trip, one commit). It covers
the resource fields the pilot stream uses (site, platform, CPU time, processors, memory, tags,
required tags; no SubmitPools, no ClassAd expressions, no limits, no site mask, no retiring of
empty queues), so its number is an upper bound for the next step, not a finished design.

The workload and the pilots are those of bench/pilot_stream.py (K = ``--k``, default 10); the
stream's own checks judge every claim (misses, duplicates, violations). The Python path is
measured on the same load just before, through pilot_stream's own measurement, and the two
alternate ``--rounds`` times. One JSON line per measurement. The function is dropped at the
end. Run from the repository root::

    .venv/bin/python bench/claim_round_trip_pg.py --url postgresql+psycopg://postgres@127.0.0.1:5432/x
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == _HERE:
    sys.path[0] = str(_HERE.parent)

import argparse  # noqa: E402
import importlib  # noqa: E402
import multiprocessing as mp  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

FUNCTION = """
CREATE OR REPLACE FUNCTION gp_scratch_claim(
    p_vo text, p_site text, p_platform text, p_cpu bigint, p_procs integer, p_mem integer,
    p_tags text[], p_required text[], p_ref text, p_ce text, p_now timestamp, p_e float8)
RETURNS TABLE(id bigint, vo text, owner text, owner_group text, job_type text,
              description text, description_format text, bulk_index integer)
LANGUAGE plpgsql AS $fn$
DECLARE
    q record;
    j bigint;
BEGIN
    FOR q IN
        SELECT t.id AS tq, t.priority AS prio FROM task_queues t
        WHERE t.active = 1 AND t.vo = p_vo AND t.expression IS NULL
          AND t.submit_pool IS NULL AND t.cpu_time <= p_cpu AND t.processors <= p_procs
          AND t.memory <= p_mem
          AND (NOT EXISTS (SELECT 1 FROM tq_sites s WHERE s.tq_id = t.id)
               OR EXISTS (SELECT 1 FROM tq_sites s WHERE s.tq_id = t.id AND s.value = p_site))
          AND NOT EXISTS (SELECT 1 FROM tq_banned_sites b
                          WHERE b.tq_id = t.id AND b.value = p_site)
          AND (NOT EXISTS (SELECT 1 FROM tq_platforms p WHERE p.tq_id = t.id)
               OR EXISTS (SELECT 1 FROM tq_platforms p
                          WHERE p.tq_id = t.id AND p.value = p_platform))
          AND NOT EXISTS (SELECT 1 FROM tq_tags g
                          WHERE g.tq_id = t.id AND g.value <> ALL (p_tags))
          AND NOT EXISTS (SELECT 1 FROM unnest(p_required) r(v)
                          WHERE NOT EXISTS (SELECT 1 FROM tq_tags g
                                            WHERE g.tq_id = t.id AND g.value = r.v))
        ORDER BY t.draw_key, t.id
    LOOP
        DELETE FROM task_queue_jobs
        WHERE job_id = (SELECT x.job_id FROM task_queue_jobs x WHERE x.tq_id = q.tq
                        ORDER BY x.rank, x.job_id LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING job_id INTO j;
        IF j IS NOT NULL THEN
            UPDATE task_queues SET draw_key = draw_key + p_e / greatest(q.prio, 1e-12)
            WHERE task_queues.id = (SELECT t2.id FROM task_queues t2 WHERE t2.id = q.tq
                                    FOR UPDATE SKIP LOCKED);
            UPDATE jobs SET status = 'Matched', minor_status = 'Assigned to pilot',
                            pilot_reference = p_ref, site = p_site, ce = p_ce,
                            heartbeat_at = p_now
            WHERE jobs.id = j AND jobs.status = 'Waiting';
            IF NOT FOUND THEN
                RAISE EXCEPTION 'job % was in a task queue but is no longer Waiting', j;
            END IF;
            INSERT INTO job_status_history (job_id, at, status, minor_status, source)
            VALUES (j, p_now, 'Matched', 'Assigned to pilot', 'matcher');
            RETURN QUERY SELECT b.id::bigint, b.vo::text, b.owner::text, b.owner_group::text,
                                b.job_type::text, b.description::text,
                                b.description_format::text, b.bulk_index
                         FROM jobs b WHERE b.id = j;
            RETURN;
        END IF;
    END LOOP;
END
$fn$
"""
CALL = "SELECT * FROM gp_scratch_claim(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"


def stream_module() -> ModuleType:
    """bench/pilot_stream.py, importable by name (its spawned claimers unpickle its classes):
    this folder goes last on sys.path, so that the packages still come first."""
    if str(_HERE) not in sys.path:
        sys.path.append(str(_HERE))
    return importlib.import_module("pilot_stream")


def measure_function(url: str, ps: ModuleType, wl: Any, job_ids: list[int], claims: int,
                     seed: int) -> dict[str, Any]:
    """Claim ``claims`` times through the function, one pilot at a time, in this process."""
    import psycopg
    from sqlalchemy.engine import make_url

    u = make_url(url)
    conninfo = psycopg.conninfo.make_conninfo(
        host=u.host or "", port=u.port or 5432, user=u.username or "",
        password=u.password or "", dbname=u.database or "")
    ctx = mp.get_context("spawn")
    waiting = [0] * wl.k
    for q in wl.job_queue:
        waiting[q] += 1
    shared = ps.Shared(lock=ctx.Lock(), taken=ctx.Array("b", len(job_ids), lock=False),
                       waiting=ctx.Array("l", waiting, lock=False), stop=ctx.Value("i", 0),
                       budget=ctx.Value("l", claims))
    spec = ps.ClaimerSpec(0, url, wl.k, wl.job_queue, job_ids, 1, 1, seed, "function", 1e9)
    stream = ps.Stream(spec, shared)
    result = ps.ClaimerResult(0)
    rng = stream.rng
    with psycopg.connect(conninfo, autocommit=True) as conn:
        backend_pid = conn.info.backend_pid
        before = ps.sample(ps.server_processes("postgresql"))
        backend0 = ps.proc_cpu(backend_pid) or 0.0
        perf, cpu = time.perf_counter, time.process_time
        loop_cpu0 = cpu()
        with conn.cursor() as cur:
            for _ in range(claims):
                drawn = stream.next_pilot()
                if drawn is None:
                    break
                pilot, reference = drawn
                t0, c0 = perf(), cpu()
                cur.execute(CALL, (
                    ps.VO, pilot.site, pilot.platform, pilot.cpu_time, pilot.processors,
                    pilot.memory, sorted(pilot.tags), sorted(pilot.required_tags), reference,
                    f"ce1.{pilot.site.lower()}", datetime.now(UTC).replace(tzinfo=None),
                    rng.expovariate(1.0)), prepare=True)
                rows = cur.fetchall()
                result.cpu_seconds += cpu() - c0
                result.latencies.append(perf() - t0)
                stream.record(result, pilot, [r[0] for r in rows])
        loop_cpu = cpu() - loop_cpu0
        backend = (ps.proc_cpu(backend_pid) or 0.0) - backend0
        after = ps.sample(ps.server_processes("postgresql"))
    tq = ps.sibling("taskqueue")
    window = after.at - before.at
    lat = sorted(result.latencies)
    done = len(lat)
    busy = after.busy - before.busy
    db = ps.matched_in_database(url)
    return {
        "measure": "claim_one_round_trip", "backend": "postgresql", "k": wl.k,
        "jobs_loaded": len(job_ids), "processes": 1, "count": 1, "path": "plpgsql_prototype",
        "claims": done, "jobs": result.jobs, "seconds": round(window, 3),
        "claims_per_s": tq._rate(done, window), "p50_ms": tq._percentile_ms(lat, 0.5),
        "p99_ms": tq._percentile_ms(lat, 0.99), "empty_answers": result.empty,
        "misses": result.misses, "duplicates": result.duplicates,
        "violations": result.violations + db["background_touched"],
        "database_agrees": db["matched"] == result.jobs,
        "client_cpu_ms_per_claim": round(result.cpu_seconds * 1000 / done, 3) if done else None,
        "server_cpu_ms_per_claim": round(backend * 1000 / done, 3) if done else None,
        "statements_per_claim": 1.0, "commits_per_claim": 1.0,
        "load": {"cores": ps.os.cpu_count(),
                 "busy_cores": round(busy / window, 2) if window else None,
                 "other_cores": round((busy - loop_cpu - backend) / window, 2)
                 if window else None,
                 "loadavg_1m_before": before.loadavg, "loadavg_1m_after": after.loadavg},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="PostgreSQL SQLAlchemy URL")
    parser.add_argument("--k", type=int, default=10, help="task queues (default 10)")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs (default 20000)")
    parser.add_argument("--claims", type=int, default=3000,
                        help="claims per measurement (default 3000)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="Python path and function, alternated (default 2)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    ps = stream_module()
    tq = ps.sibling("taskqueue")
    from sqlalchemy import text

    from gridpilot import schema
    from taskqueue.database import make_engine

    backend = tq.backend_of(args.url)
    if backend != "postgresql":
        raise SystemExit("this prototype is PostgreSQL only")
    engine = make_engine(args.url)
    try:
        schema.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text(FUNCTION))
    finally:
        engine.dispose()
    ps.emit(tq.server_info(args.url, backend))
    wl = ps.make_workload(args.k, args.jobs, args.seed)
    try:
        for _ in range(args.rounds):
            for path in ("matcher", "function"):
                ps.load_workload(args.url, backend, wl)
                tq.analyze(args.url, backend, vacuum=True)
                job_ids = ps.job_ids_by_number(args.url, len(wl.job_queue))
                if path == "function":
                    record = measure_function(args.url, ps, wl, job_ids, args.claims, args.seed)
                else:
                    record = ps.measure(args.url, backend, wl, job_ids, processes=1, count=1,
                                        seed=args.seed, path=path, claims=args.claims,
                                        seconds=600, profile=None)
                ps.emit(record)
                ps.log(f"{path}: {record['claims_per_s']} claims/s, client "
                       f"{record['client_cpu_ms_per_claim']} ms, server "
                       f"{record['server_cpu_ms_per_claim']} ms per claim, misses "
                       f"{record['misses']}, violations {record['violations']}")
    finally:
        ps.clear_vos(args.url, [ps.VO])
        engine = make_engine(args.url)
        try:
            with engine.begin() as conn:
                conn.execute(text(
                    "DROP FUNCTION IF EXISTS gp_scratch_claim(text, text, text, bigint, "
                    "integer, integer, text[], text[], text, text, timestamp, float8)"))
        finally:
            engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
