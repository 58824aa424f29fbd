"""A/B of PostgreSQL claim-function variants: the same workload and the same pilots for each
variant, in interleaved rounds, with the backend's CPU per claim read from /proc.

Each VARIANT is a file holding a ``CREATE OR REPLACE FUNCTION gridpilot_claim(...)`` text
(``-``: the canonical text, taskqueue/matching/sql/claim_postgresql.sql; each is installed
before its own run, so that no run measures the variant installed by the one before it). A
file may set its schema up in statements before the function's (no parameters: psycopg runs
them as one script), e.g. to measure the same function without an index. For each round and
each variant in turn: the
variant is installed, bench/pilot_stream.py's workload (``--jobs`` waiting jobs over ``--k``
queues, VO ``benchvo``) is loaded afresh and vacuumed, and ``--claims`` pilots (the same for
every variant) claim one job each on one autocommit connection, the first 50 as a warm-up.
One JSON line per run: the backend's CPU ms per claim, the wall ms per call, the jobs handed
out and a digest of the answers (each row's kind and payload: equal for equal rules), and the
CPU per claim as a multiple of the calibration UPDATE's (bench/calibration.py, measured on the
same database at the start of each round and printed as its own line). On a shared machine
rounds differ: compare within a round. The installed function is put back (its canonical
text) at the end.

    .venv/bin/python bench/claim_variants.py --url postgresql+psycopg://postgres@127.0.0.1/x \\
        - variant.sql
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pilot_stream as ps
import queue_ops
from calibration import calibrate
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
    import psycopg

    from taskqueue.core.resources import parse_resource
    from taskqueue.matching.sql import canonical_text
    from taskqueue.pilots.pilotmatch import _CALL, _parameters

    original = canonical_text("postgresql")
    texts = {v: original if v == "-" else Path(v).read_text() for v in args.variants}
    if backend_of(args.url) != "postgresql":
        raise SystemExit("bench/claim_variants.py compares PostgreSQL claim functions only")
    dsn = args.url.replace("postgresql+psycopg://", "postgresql://")
    wl = ps.make_workload(args.k, args.claims + 200, 1)
    try:
        for rnd in range(args.rounds):
            calibration = calibrate(args.url, "postgresql")
            floor_ms = calibration["update_commit"]["server_cpu_ms"]
            print(json.dumps({**calibration, "round": rnd}), flush=True)
            for name, text in texts.items():
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(text)
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
                    rows: list[list[Any]] = []
                    cpu0, t0 = _cpu_of(pid), time.perf_counter()
                    for params in calls[WARM_UP:]:
                        rows.append(cur.execute(_CALL, params).fetchall())
                    wall, cpu = time.perf_counter() - t0, _cpu_of(pid) - cpu0
                jobs = sum(len(r) for r in rows)
                # What each call handed out, without the ids a fresh load renumbers.
                digest = hashlib.sha256(repr([[(r[0], r[7]) for r in answer]
                                              for answer in rows]).encode()).hexdigest()
                n = len(calls) - WARM_UP
                per_claim = cpu * 1000 / n
                print(json.dumps({"measure": "claim_variant", "round": rnd, "variant": name,
                                  "k": args.k, "claims": n, "jobs": jobs,
                                  "answers_digest": digest[:16],
                                  "server_cpu_ms_per_claim": round(per_claim, 3),
                                  "server_cpu_x_calibration":
                                      round(per_claim / floor_ms, 2) if floor_ms else None,
                                  "wall_ms_per_claim": round(wall * 1000 / n, 3)}),
                      flush=True)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(original)
        ps.clear_vos(args.url, [ps.VO])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
