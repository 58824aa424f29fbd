"""A/B of PostgreSQL claim-function variants: the same workload and the same pilots for each
variant, in interleaved rounds, with the backend's CPU per claim read from /proc.

Each VARIANT is a file holding a ``CREATE OR REPLACE FUNCTION gridpilot_claim(...)`` text
(``-``: the canonical text, taskqueue/matching/sql/claim_postgresql.sql; each is installed
before its own run, so that no run measures the variant installed by the one before it). A
file may set its schema up in statements before the function's (no parameters: psycopg runs
them as one script), e.g. to measure the same function without an index; nothing undoes them
at the end. For each round and each variant in turn: the variant is installed,
bench/pilot_stream.py's workload (``--claims`` + 200 waiting jobs over ``--k`` queues, VO
``benchvo``) is loaded afresh and vacuumed, and ``--claims`` pilots (the same for every
variant) claim one job each on one autocommit connection, the first 50 as a warm-up. One JSON
line per run: the backend's CPU ms per claim (and its user part), the wall ms per call, the
jobs handed out and a digest of the answers (each row's kind and payload: equal for equal
rules), and the CPU per claim as a multiple of the calibration UPDATE's (bench/calibration.py,
measured on the same database at the start of each round and printed as its own line).

On a shared machine rounds differ (by up to 40% for one function): compare within a round, or
use ``--interleave BLOCK``: each variant's function goes into a schema of its own
(``gp_claim_variant_<i>``, dropped at the end; function texts only, a file's other statements
find no tables there), the workload is loaded once per round, and one connection per variant
(its schema first on the search path) claims BLOCK pilots in turn, the order rotating, so
that whatever else the machine does falls on every variant alike. Each variant's line then
has its CPU as a multiple of the first variant's; the answers differ a little (the variants
draw from one pool), so no digest. The installed function is put back (its canonical text)
at the end.

    .venv/bin/python bench/claim_variants.py --url postgresql+psycopg://postgres@127.0.0.1/x \\
        --rounds 3 --claims 1000 --interleave 25 - variant.sql
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
from kit import backend_of, process_cpu

WARM_UP = 50
#: --interleave: variant i's function lives in schema gp_claim_variant_<i>.
_SCHEMA = "gp_claim_variant_"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("variants", nargs="+", help="files of function text, or - (as is)")
    parser.add_argument("--url", required=True, help="a PostgreSQL database on this host")
    parser.add_argument("--k", type=int, default=1000, help="task queues (default 1000)")
    parser.add_argument("--claims", type=int, default=2000, help="claims per run (default 2000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--interleave", type=int, default=0, metavar="BLOCK",
                        help="every variant side by side in one load, BLOCK claims each in "
                        "turn (function texts only; see above)")
    args = parser.parse_args(argv)
    if min(args.k, args.rounds) < 1 or args.claims <= WARM_UP or args.interleave < 0:
        parser.error(f"--k and --rounds must be positive, --claims above {WARM_UP}, "
                     "--interleave not negative")
    import psycopg

    from taskqueue.core.resources import parse_resource
    from taskqueue.matching.sql import canonical_text
    from taskqueue.pilots.pilotmatch import _CALL, _parameters

    original = canonical_text("postgresql")
    texts = {v: original if v == "-" else Path(v).read_text() for v in args.variants}
    if backend_of(args.url) != "postgresql":
        raise SystemExit("bench/claim_variants.py compares PostgreSQL claim functions only")
    dsn = args.url.replace("postgresql+psycopg://", "postgresql://")
    if args.interleave:
        wl = ps.make_workload(args.k, args.claims * len(texts) + 200, 1)
        try:
            for rnd in range(args.rounds):
                _interleaved_round(args, rnd, texts, dsn, wl)
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for i in range(len(texts)):
                    conn.execute(f"DROP SCHEMA IF EXISTS {_SCHEMA}{i} CASCADE")
            ps.clear_vos(args.url, [ps.VO])
        return 0
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
                    cpu0, t0 = process_cpu(pid), time.perf_counter()
                    for params in calls[WARM_UP:]:
                        rows.append(cur.execute(_CALL, params).fetchall())
                    wall, cpu1 = time.perf_counter() - t0, process_cpu(pid)
                user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
                cpu = user + system
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
                                  "server_user_ms_per_claim": round(user * 1000 / n, 3),
                                  "server_cpu_x_calibration":
                                      round(per_claim / floor_ms, 2) if floor_ms else None,
                                  "wall_ms_per_claim": round(wall * 1000 / n, 3)}),
                      flush=True)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(original)
        ps.clear_vos(args.url, [ps.VO])
    return 0


def _interleaved_round(args: argparse.Namespace, rnd: int, texts: dict[str, str], dsn: str,
                       wl: Any) -> None:
    """One round of --interleave: each variant's function in a schema of its own, one
    connection each (that schema first on its search path), one load of the workload, and
    the claims in blocks of --interleave, the variants taking turns (in an order that rotates),
    so that whatever else the machine does falls on all of them alike."""
    import psycopg

    from taskqueue.core.resources import parse_resource
    from taskqueue.pilots.pilotmatch import _CALL, _parameters

    calibration = calibrate(args.url, "postgresql")
    floor_ms = calibration["update_commit"]["server_cpu_ms"]
    print(json.dumps({**calibration, "round": rnd}), flush=True)
    names = list(texts)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i, name in enumerate(names):
            conn.execute(f"DROP SCHEMA IF EXISTS {_SCHEMA}{i} CASCADE")
            conn.execute(f"CREATE SCHEMA {_SCHEMA}{i}")
            conn.execute(f"SET search_path TO {_SCHEMA}{i}")
            conn.execute(texts[name])
    ps.load_workload(args.url, "postgresql", wl)
    queue_ops.analyze(args.url, "postgresql", vacuum=True)
    rng = random.Random(7 + rnd)
    order = list(range(len(wl.job_queue)))
    rng.shuffle(order)
    calls = []
    for i in order[:args.claims * len(names)]:
        pilot = ps.pilot_for(ps.queue_spec(wl.job_queue[i]), rng, 1)
        calls.append(_parameters(parse_resource(pilot.data(f"ab-{i}")), now=datetime.now(UTC),
                                 count=1, rng=random.Random(i), with_expressions=True))
    conns = [psycopg.connect(dsn, autocommit=True) for _ in names]
    try:
        cursors, pids = [], []
        for i, conn in enumerate(conns):
            cur = conn.cursor()
            cur.execute(f"SET search_path TO {_SCHEMA}{i}, public")
            row = cur.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            cursors.append(cur)
            pids.append(int(row[0]))
        queue = iter(calls)
        for cur in cursors:
            for _ in range(WARM_UP):
                cur.execute(_CALL, next(queue)).fetchall()
        spent = [[0.0, 0.0, 0.0] for _ in names]  # user, system, wall
        done, jobs = [0] * len(names), [0] * len(names)
        block = 0
        while True:
            batch = [c for _, c in zip(range(args.interleave * len(names)), queue, strict=False)]
            if not batch:
                break
            for turn in range(len(names)):
                v = (turn + block) % len(names)
                part = batch[turn * args.interleave:(turn + 1) * args.interleave]
                cpu0, t0 = process_cpu(pids[v]), time.perf_counter()
                for params in part:
                    jobs[v] += len(cursors[v].execute(_CALL, params).fetchall())
                wall, cpu1 = time.perf_counter() - t0, process_cpu(pids[v])
                spent[v][0] += cpu1[0] - cpu0[0]
                spent[v][1] += cpu1[1] - cpu0[1]
                spent[v][2] += wall
                done[v] += len(part)
            block += 1
    finally:
        for conn in conns:
            conn.close()
    first = None
    for v, name in enumerate(names):
        n = max(done[v], 1)
        per_claim = (spent[v][0] + spent[v][1]) * 1000 / n
        first = per_claim if first is None else first
        print(json.dumps({"measure": "claim_variant", "round": rnd, "variant": name,
                          "interleave": args.interleave, "k": args.k, "claims": done[v],
                          "jobs": jobs[v],
                          "server_cpu_ms_per_claim": round(per_claim, 3),
                          "server_user_ms_per_claim": round(spent[v][0] * 1000 / n, 3),
                          "server_cpu_x_first": round(per_claim / first, 3) if first else None,
                          "server_cpu_x_calibration":
                              round(per_claim / floor_ms, 2) if floor_ms else None,
                          "wall_ms_per_claim": round(spent[v][2] * 1000 / n, 3)}), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
