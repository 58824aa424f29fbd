"""Optimizer benchmark: jobs per second from JDL text to Waiting in a task queue.

Each round parses a batch of JDLs (a realistic mix: plain jobs, multi-core jobs, site lists, an
RFC 7 Requirements section, a gLite Requirements expression), stores them and runs the whole
optimizer chain in one transaction per batch, with durable commits. One JSON line per
measurement on stdout; progress on stderr. Run from the repository root::

    .venv/bin/python bench/optimizers.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from gridpilot import schema  # noqa: E402
from optimizers.chain import ChainContext, Identity, submissions_from_text, submit  # noqa: E402
from optimizers.resources import load_resources  # noqa: E402
from taskqueue.database import make_engine, make_session_factory  # noqa: E402
from taskqueue.settings import Settings  # noqa: E402

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


def fresh_url(base: str) -> tuple[str, str | None]:
    parsed = make_url(base)
    if parsed.get_backend_name() == "sqlite":
        path = Path(tempfile.mkdtemp(prefix="gp_bench_opt_")) / "bench.db"
        return f"sqlite:///{path}", None
    name = f"gp_bench_opt_{secrets.token_hex(4)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    force = " WITH (FORCE)" if parsed.get_backend_name() == "postgresql" else ""
    return parsed.set(database=name).render_as_string(hide_password=False), \
        f"DROP DATABASE IF EXISTS {name}{force}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="sqlite:///:memory:",
                        help="SQLAlchemy URL of a server (a fresh database is made on it) "
                             "or any sqlite URL (a fresh file is used)")
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--resources", type=Path, default=_ROOT / "conf" / "resources.toml")
    args = parser.parse_args()
    url, drop = fresh_url(args.url)
    backend = make_url(url).get_backend_name()
    engine = make_engine(url)
    try:
        schema.upgrade(engine)
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
            "measure": "jdl_to_waiting", "backend": backend, "jobs": args.jobs,
            "batch": args.batch, "waiting": waiting, "failed": failed,
            "seconds": round(total, 2), "jobs_per_s": round(args.jobs / total, 1),
            "parse_seconds": round(parse_s, 2), "store_and_chain_seconds": round(chain_s, 2),
        }), flush=True)
    finally:
        engine.dispose()
        if drop:
            admin = create_engine(args.url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(drop))
            admin.dispose()


if __name__ == "__main__":
    main()
