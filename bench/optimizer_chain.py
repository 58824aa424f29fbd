"""Optimizer benchmark: jobs per second from JDL text to Waiting in a task queue.

Each round parses a batch of JDLs (a realistic mix: plain jobs, multi-core jobs, site lists, an
RFC 7 Requirements section, a gLite Requirements expression), stores them and runs the whole
optimizer chain in one transaction per batch, with durable commits. One JSON line per
measurement on stdout; progress on stderr. Run from the repository root::

    .venv/bin/python bench/optimizer_chain.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from kit import fresh_database, url_option

from optimizers.chain import ChainContext, Identity, submissions_from_text, submit
from optimizers.resources import load_resources
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine, make_session_factory

_ROOT = Path(__file__).resolve().parent.parent

SITES = ["LCG.CERN.cern", "LCG.CNAF.it", "LCG.RAL.uk"]


def jdl_for(i: int, rng: random.Random) -> str:
    kind = i % 10
    lines = [f'Executable = "run-{i % 17}.sh"', f'Arguments = "--event {i} --seed {i % 97}"',
             f"CPUTime = {rng.choice([1800, 3600, 7200, 86400])}",
             f"Priority = {rng.randint(0, 5)}", f'JobName = "bench-{i}"',
             'InputSandbox = {"config.py", "data.txt"}', 'StdOutput = "std.out"']
    if kind < 3:
        lines.append(f'Site = {{"{rng.choice(SITES)}", "{rng.choice(SITES)}"}}')
    if kind == 4:
        lines += ["NumberOfProcessors = 8", "MaxRAM = 16000", 'Tags = {"MultiProcessor"}']
    if kind == 5:
        lines.append('Requirements = [ Platform = {"x86_64-el9"}; MaxRAM = 2000 ]')
    if kind == 6:
        lines.append('Requirements = other.MaxRAM >= 2000 && other.NumberOfProcessors >= 1')
    return "[\n  " + ";\n  ".join(lines) + "\n]\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    url_option(parser, "sqlite://")
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--resources", type=Path, default=_ROOT / "conf" / "resources.toml")
    args = parser.parse_args()
    with fresh_database(args.url, prefix="gp_bench_opt") as db:
        engine = make_engine(db.url)
        try:
            factory = make_session_factory(engine)
            rng = random.Random(1)
            texts = [jdl_for(i, rng) for i in range(args.jobs)]
            resources = load_resources(args.resources)
            identity = Identity("lhcb", "bench", "lhcb_user")
            parse_s = chain_s = 0.0
            waiting = failed = 0
            started = time.perf_counter()
            for start in range(0, args.jobs, args.batch):
                t0 = time.perf_counter()
                subs = [s for t in texts[start:start + args.batch]
                        for s in submissions_from_text(t, "jdl")]
                t1 = time.perf_counter()
                ctx = ChainContext(Settings(), resources, datetime.now(UTC), rng)
                with factory.begin() as session:
                    result = submit(session, subs, identity, ctx)
                t2 = time.perf_counter()
                parse_s += t1 - t0
                chain_s += t2 - t1
                waiting += len(result.waiting)
                failed += len(result.failed)
                if (start // args.batch) % 10 == 0:
                    print(f"[{time.strftime('%H:%M:%S')}] {start + len(subs):,} jobs",
                          file=sys.stderr, flush=True)
            total = time.perf_counter() - started
            print(json.dumps({
                "measure": "jdl_to_waiting", "backend": db.backend, "jobs": args.jobs,
                "batch": args.batch, "waiting": waiting, "failed": failed,
                "seconds": round(total, 2), "jobs_per_s": round(args.jobs / total, 1),
                "parse_seconds": round(parse_s, 2), "store_and_chain_seconds": round(chain_s, 2),
            }), flush=True)
        finally:
            engine.dispose()


if __name__ == "__main__":
    main()
