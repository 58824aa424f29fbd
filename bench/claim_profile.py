"""Where a PostgreSQL claim's time goes: each statement the claim function runs, with its
plan, buffers and time, for a stream of pilots (bench/pilot_stream.py's workload and pilots).

The workload (``--jobs`` waiting jobs over ``--k`` queues, VO ``benchvo``) is loaded into
``--url``; then ``--claims`` pilots claim, one call of ``gridpilot_claim`` each, on one
connection that has ``auto_explain`` loaded for its session (log_nested_statements,
log_analyze with buffers and timing, the plans sent to the client as NOTICEs: this needs a
superuser, and no server setting changes). Printed, as JSON lines: per statement of the
function (its first words), the calls, total and mean milliseconds, shared buffers hit, and
one sample plan; the calls' own mean time with and without auto_explain (its instrumentation
costs time too: compare shares, not absolute times); and the top-level EXPLAIN (ANALYZE,
BUFFERS) of one call. ``pg_stat_statements`` with ``track = all`` gives the same split in a
running service, but needs the library preloaded (a server restart): where it is, its top
statements are printed too.

    .venv/bin/python bench/claim_profile.py --url postgresql+psycopg://postgres@127.0.0.1/x
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pilot_stream as ps
import queue_ops as tq
from kit import backend_of, upgrade_schema

_DURATION = re.compile(r"duration: ([0-9.]+) ms\s+plan:\s*(.*)", re.S)
_QUERY = re.compile(r"Query Text: (.*?)\n(?:\S|$)", re.S)


def statement_key(query: str) -> str:
    words = " ".join(query.split())
    return words[:90]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="a PostgreSQL database the benchmark "
                        "may write its own VO into (superuser, for auto_explain)")
    parser.add_argument("--k", type=int, default=1000, help="task queues (default 1000)")
    parser.add_argument("--jobs", type=int, default=20_000, help="waiting jobs (default 20000)")
    parser.add_argument("--claims", type=int, default=500, help="claims profiled (default 500)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    from taskqueue.core.resources import parse_resource
    from taskqueue.pilots.pilotmatch import _CALL, _parameters

    backend = backend_of(args.url)
    if backend != "postgresql":
        raise SystemExit("bench/claim_profile.py profiles PostgreSQL's claim function only")
    upgrade_schema(args.url)
    wl = ps.make_workload(args.k, args.jobs, args.seed)
    ps.load_workload(args.url, backend, wl)
    tq.analyze(args.url, backend, vacuum=True)
    rng = random.Random(args.seed)
    order = list(range(len(wl.job_queue)))
    rng.shuffle(order)

    def pilots(n: int, offset: int) -> list[tuple[Any, ...]]:
        out = []
        for i in order[offset:offset + n]:
            pilot = ps.pilot_for(ps.queue_spec(wl.job_queue[i]), rng, 1)
            resource = parse_resource(pilot.data(f"prof-{i}"))
            out.append(_parameters(resource, now=datetime.now(UTC), count=1, rng=rng,
                                   with_expressions=True))
        return out

    import psycopg

    dsn = args.url.replace("postgresql+psycopg://", "postgresql://")
    notices: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        cur = conn.cursor()
        # Warm the connection's plans, then the plain rate.
        third = args.claims // 3
        for params in pilots(20, 0):
            cur.execute(_CALL, params).fetchall()
        t0 = time.perf_counter()
        for params in pilots(third, 20):
            cur.execute(_CALL, params).fetchall()
        plain_ms = (time.perf_counter() - t0) * 1000 / max(third, 1)
        for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                        "SET auto_explain.log_nested_statements = on",
                        "SET auto_explain.log_analyze = on",
                        "SET auto_explain.log_buffers = on",
                        "SET auto_explain.log_timing = on",
                        "SET auto_explain.log_level = notice", "SET client_min_messages = notice"):
            cur.execute(setting)
        notices.clear()
        t0 = time.perf_counter()
        n = args.claims - third
        for params in pilots(n, 20 + third):
            cur.execute(_CALL, params).fetchall()
        explained_ms = (time.perf_counter() - t0) * 1000 / max(n, 1)
        cur.execute("SET auto_explain.log_min_duration = -1")
        stats: dict[str, dict[str, Any]] = defaultdict(
            lambda: {"calls": 0, "ms": 0.0, "hits": 0, "plan": ""})
        for message in notices:
            m = _DURATION.search(message)
            if not m:
                continue
            plan = m.group(2)
            q = _QUERY.search(plan)
            key = statement_key(q.group(1) if q else plan.splitlines()[0])
            entry = stats[key]
            entry["calls"] += 1
            entry["ms"] += float(m.group(1))
            hits = re.search(r"Buffers: shared hit=(\d+)", plan)
            entry["hits"] += int(hits.group(1)) if hits else 0
            if not entry["plan"]:
                entry["plan"] = plan
        total = sum(e["ms"] for k, e in stats.items() if not k.startswith("SELECT kind"))
        for key, e in sorted(stats.items(), key=lambda kv: -kv[1]["ms"]):
            print(json.dumps({"measure": "claim_statement", "statement": key,
                              "calls": e["calls"], "ms_total": round(e["ms"], 2),
                              "ms_mean": round(e["ms"] / e["calls"], 4),
                              "share_of_nested": round(e["ms"] / total, 3) if total else None,
                              "shared_hits_mean": round(e["hits"] / e["calls"], 1),
                              "plan": e["plan"][:20000]}))
        params = pilots(1, 20 + args.claims)[0]
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + _CALL, params)
        top = "\n".join(r[0] for r in cur.fetchall())
        pgss = None
        try:
            cur.execute("SELECT query, calls, total_exec_time FROM pg_stat_statements "
                        "ORDER BY total_exec_time DESC LIMIT 15")
            pgss = [list(r) for r in cur.fetchall()]
        except psycopg.Error:
            pgss = None
        print(json.dumps({"measure": "claim_call", "k": args.k, "jobs": args.jobs,
                          "claims": args.claims, "mean_ms_plain": round(plain_ms, 3),
                          "mean_ms_with_auto_explain": round(explained_ms, 3),
                          "explain_one_call": top, "pg_stat_statements": pgss}))
    ps.clear_vos(args.url, [ps.VO])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
