"""Expression-cost benchmark: how long one match takes while a hostile Requirements queue waits.

The hostile queue's jobs carry a ``Requirements`` expression of ``--terms`` chained
``regexp("(a|aa)+$", strcat(other.Site, "aaaa…b"))`` calls: it never holds, and each call
backtracks exponentially. It is stored directly in a task queue (as it would be if it had been
accepted at submission, or stored before submission refused it), beside one plain queue with
``--jobs`` waiting jobs, at a higher priority so that the hostile queue is first in draw order.
Then ``--matches`` claims are made in process, each in its own transaction, for a pilot of the
VO that can run the plain jobs (``taskqueue.matching.claim_jobs`` with the ClassAd check the
matcher uses); each one's time is measured. A baseline without the hostile queue comes first.

One JSON line per measurement on stdout (``"measure": "match_with_hostile_queue"``): backend,
terms, expression bytes, matches, jobs claimed, mean/max seconds per match. Run from the
repository root::

    .venv/bin/python bench/expressions.py --url postgresql+psycopg://postgres@127.0.0.1:5432/x
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
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from gridpilot import schema  # noqa: E402
from optimizers.classads import expression_check  # noqa: E402
from taskqueue.database import make_engine, make_session_factory  # noqa: E402
from taskqueue.definitions import JobRequirements  # noqa: E402
from taskqueue.jobs import NewJob, add_jobs, apply_transition  # noqa: E402
from taskqueue.matching import claim_jobs  # noqa: E402
from taskqueue.queues import QueueEntry, enqueue_jobs  # noqa: E402
from taskqueue.resources import parse_resource  # noqa: E402
from taskqueue.settings import Settings  # noqa: E402
from taskqueue.states import JobStatus  # noqa: E402


def hostile_expression(terms: int) -> str:
    """``terms`` catastrophic-backtracking regexps joined by ||, none of which can hold."""
    call = 'regexp("(a|aa)+$", strcat(other.Site, "' + "a" * 28 + 'b"))'
    return " || ".join([call] * terms)


def fresh_url(base: str) -> tuple[str, str | None]:
    parsed = make_url(base)
    if parsed.get_backend_name() == "sqlite":
        path = Path(tempfile.mkdtemp(prefix="gp_bench_expr_")) / "bench.db"
        return f"sqlite:///{path}", None
    name = f"gp_bench_expr_{secrets.token_hex(4)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    force = " WITH (FORCE)" if parsed.get_backend_name() == "postgresql" else ""
    return parsed.set(database=name).render_as_string(hide_password=False), \
        f"DROP DATABASE IF EXISTS {name}{force}"


def store(factory: Any, reqs: JobRequirements, count: int, priority: int,
          now: datetime) -> None:
    with factory.begin() as session:
        ids = add_jobs(session, [NewJob('[Executable = "x"]', reqs, priority)] * count, now=now)
        apply_transition(session, ids, JobStatus.RECEIVED, JobStatus.CHECKING,
                         minor_status="bench", source="bench", now=now)
        enqueue_jobs(session, [QueueEntry(i, reqs, priority) for i in ids], Settings(),
                     now=now, rng=random.Random(1))


def measure(factory: Any, matches: int) -> tuple[int, list[float]]:
    times: list[float] = []
    claimed = 0
    for i in range(matches):
        resource = parse_resource({"vo": "lhcb", "site": "LCG.CERN.cern",
                                   "pilot_reference": f"bench-{i}", "cpu_time": 86400})
        started = time.perf_counter()
        with factory.begin() as session:
            claimed += len(claim_jobs(session, resource, now=datetime.now(UTC),
                                      expression_check=expression_check(resource)))
        times.append(time.perf_counter() - started)
    return claimed, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="sqlite:///:memory:",
                        help="SQLAlchemy URL of a server (a fresh database is made on it) "
                             "or any sqlite URL (a fresh file is used)")
    parser.add_argument("--terms", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--matches", type=int, default=5)
    args = parser.parse_args()
    url, drop = fresh_url(args.url)
    backend = make_url(url).get_backend_name()
    engine = make_engine(url)
    try:
        schema.upgrade(engine)
        factory = make_session_factory(engine)
        now = datetime.now(UTC)
        base = {"vo": "lhcb", "owner": "alice", "owner_group": "lhcb_user", "cpu_time": 3600}
        store(factory, JobRequirements(**base), args.jobs, 1, now)
        for hostile in (False, True):
            expression = hostile_expression(args.terms)
            if hostile:
                store(factory, JobRequirements(**base, expression=expression), 1, 10, now)
            claimed, times = measure(factory, args.matches)
            print(json.dumps({
                "measure": "match_with_hostile_queue" if hostile else "match_baseline",
                "backend": backend, "terms": args.terms if hostile else 0,
                "expression_bytes": len(expression.encode()) if hostile else 0,
                "matches": args.matches, "claimed": claimed,
                "mean_s": round(sum(times) / len(times), 4), "max_s": round(max(times), 4),
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
