"""A/B of PostgreSQL claim-function variants: the same workload and the same pilots for each
variant, in interleaved rounds, with the backend's CPU per claim read from /proc.

Each VARIANT is a file holding a ``CREATE OR REPLACE FUNCTION gridpilot_claim(...)`` text
(``-`` leaves the installed function as it is). For each round and each variant in turn: the
variant is installed, bench/pilot_stream.py's workload (``--jobs`` waiting jobs over ``--k``
queues, VO ``benchvo``) is loaded afresh and vacuumed, and ``--claims`` pilots (the same for
every variant) claim one job each on one autocommit connection, the first 50 as a warm-up.
One JSON line per run: the backend's CPU ms per claim, the wall ms per call, the jobs handed
out (equal for equal rules). On a shared machine rounds differ: compare within a round. The
installed function is put back (its canonical text, taskqueue/matching/sql/claim_postgresql.sql)
at the end.

    .venv/bin/python bench/claim_variants.py --url postgresql+psycopg://postgres@127.0.0.1/x \\
        - variant.sql
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pilot_stream as ps
import queue_ops
from kit import backend_of, proc_cpu

WARM_UP = 50


def _cpu_of(pid: int) -> float:
    cpu = proc_cpu(pid)
    if cpu is None:
        raise SystemExit(f"the database backend {pid} is gone")
    return cpu


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("variants", nargs="+", help="files of function text, or - (as is)")
    parser.add_argument("--url", required=True, help="a PostgreSQL database on this host")
    parser.add_argument("--k", type=int, default=1000, help="task queues (default 1000)")
    parser.add_argument("--claims", type=int, default=2000, help="claims per run (default 2000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    args = parser.parse_args(argv)
    if min(args.k, args.rounds) < 1 or args.claims <= WARM_UP:
        parser.error(f"--k and --rounds must be positive, --claims above {WARM_UP}")
    texts = {v: None if v == "-" else Path(v).read_text() for v in args.variants}
    import psycopg

    from taskqueue.core.resources import parse_resource
    from taskqueue.matching.sql import canonical_text
    from taskqueue.pilots.pilotmatch import _CALL, _parameters

    original = canonical_text("postgresql")
    if backend_of(args.url) != "postgresql":
        raise SystemExit("bench/claim_variants.py compares PostgreSQL claim functions only")
    dsn = args.url.replace("postgresql+psycopg://", "postgresql://")
    wl = ps.make_workload(args.k, args.claims + 200, 1)
    try:
        for rnd in range(args.rounds):
            for name, text in texts.items():
                if text is not None:
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        conn.execute(text)  # type: ignore[arg-type]
                ps.load_workload(args.url, "postgresql", wl)
                queue_ops.analyze(args.url, "postgresql", vacuum=True)
                rng = random.Random(7)
                order = list(range(len(wl.job_queue)))
                rng.shuffle(order)
                calls: list[tuple[Any, ...]] = []
                for i in order[:args.claims]:
                    pilot = ps.pilot_for(ps.queue_spec(wl.job_queue[i]), rng, 1)
                    calls.append(_parameters(parse_resource(pilot.data(f"ab-{i}")),
                                             now=datetime.now(UTC), count=1,
                                             rng=random.Random(i), with_expressions=True))
                with psycopg.connect(dsn, autocommit=True) as conn:
                    cur = conn.cursor()
                    row = cur.execute("SELECT pg_backend_pid()").fetchone()
                    assert row is not None
                    pid = int(row[0])
                    for params in calls[:WARM_UP]:
                        cur.execute(_CALL, params).fetchall()
                    cpu0, t0, jobs = _cpu_of(pid), time.perf_counter(), 0
                    for params in calls[WARM_UP:]:
                        jobs += len(cur.execute(_CALL, params).fetchall())
                    wall, cpu = time.perf_counter() - t0, _cpu_of(pid) - cpu0
                n = len(calls) - WARM_UP
                print(json.dumps({"measure": "claim_variant", "round": rnd, "variant": name,
                                  "k": args.k, "claims": n, "jobs": jobs,
                                  "server_cpu_ms_per_claim": round(cpu * 1000 / n, 3),
                                  "wall_ms_per_claim": round(wall * 1000 / n, 3)}),
                      flush=True)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(original)
        ps.clear_vos(args.url, [ps.VO])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
