"""Expression-cost benchmark: how long one match takes while a hostile Requirements queue waits.

The hostile queue's jobs carry a ``Requirements`` expression of ``--terms`` chained
``regexp("(a|aa)+$", strcat(other.Site, "aaaa…b"))`` calls: it never holds, and each call
backtracks exponentially. It is stored directly in a task queue (as it would be if it had been
accepted at submission, or stored before submission refused it), beside one plain queue with
``--jobs`` waiting jobs, at a higher priority so that the hostile queue is first in draw order.
Then ``--matches`` claims are made in process, each in its own transaction, for a pilot of the
VO that can run the plain jobs (``taskqueue.matching.claim.claim_jobs`` with the ClassAd check the
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
import time
from datetime import UTC, datetime
from typing import Any

from kit import fresh_database, url_option

from optimizers.classads import expression_check
from taskqueue.core.definitions import JobRequirements
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db.database import make_engine, make_session_factory
from taskqueue.matching.claim import claim_jobs
from taskqueue.queues.jobs import NewJob, add_jobs, apply_transition
from taskqueue.queues.taskqueues import QueueEntry, enqueue_jobs


def hostile_expression(terms: int) -> str:
    """``terms`` catastrophic-backtracking regexps joined by ||, none of which can hold."""
    call = 'regexp("(a|aa)+$", strcat(other.Site, "' + "a" * 28 + 'b"))'
    return " || ".join([call] * terms)


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
    url_option(parser, "sqlite://")
    parser.add_argument("--terms", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--matches", type=int, default=5)
    args = parser.parse_args()
    with fresh_database(args.url, prefix="gp_bench_expr") as db:
        engine = make_engine(db.url)
        try:
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
                    "backend": db.backend, "terms": args.terms if hostile else 0,
                    "expression_bytes": len(expression.encode()) if hostile else 0,
                    "matches": args.matches, "claimed": claimed,
                    "mean_s": round(sum(times) / len(times), 4), "max_s": round(max(times), 4),
                }), flush=True)
        finally:
            engine.dispose()


if __name__ == "__main__":
    main()
