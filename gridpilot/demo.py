"""``make demo``: a small grid's jobs go into task queues and four kinds of worker node drain them.

Everything runs in-process on an SQLite file in the work folder; later stages add the matcher
service, real pilots and the site director.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from gridpilot import schema
from gridpilot.reports import queue_table
from taskqueue.database import make_engine, make_session_factory
from taskqueue.definitions import JobRequirements
from taskqueue.jobs import NewJob, add_jobs, apply_transition
from taskqueue.matching import claim_jobs, matching_queues
from taskqueue.models import Job, TaskQueue, TaskQueueJob
from taskqueue.queues import QueueEntry, enqueue_jobs
from taskqueue.resources import Resource, parse_resource
from taskqueue.settings import Settings
from taskqueue.states import JobStatus

VO = "lhcb"
SITES = ("LCG.CERN.cern", "LCG.CNAF.it", "LCG.RAL.uk")

#: The worker nodes of the demo grid, as their pilots would describe them.
NODES: dict[str, dict[str, Any]] = {
    "CERN 1-core slot": {
        "vo": VO, "site": "LCG.CERN.cern", "platform": "x86_64-el9", "processors": 1,
        "memory": 2048, "cpu_time": 172800, "tags": [],
    },
    "CNAF 8-core slot": {
        "vo": VO, "site": "LCG.CNAF.it", "platform": "x86_64-el9", "processors": 8,
        "memory": 16384, "cpu_time": 172800, "tags": ["MultiProcessor"],
    },
    "RAL GPU node": {
        "vo": VO, "site": "LCG.RAL.uk", "platform": "x86_64-el9", "processors": 4,
        "memory": 8192, "cpu_time": 86400, "tags": ["GPU", "MultiProcessor"],
        "required_tags": ["GPU"],
    },
    "CERN ARM node": {
        "vo": VO, "site": "LCG.CERN.cern", "platform": "aarch64-el9", "processors": 4,
        "memory": 8192, "cpu_time": 345600, "tags": "ANY",
    },
}


@dataclass(frozen=True)
class _Owner:
    name: str
    group: str


OWNERS = (_Owner("alice", "lhcb_user"), _Owner("bob", "lhcb_user"),
          _Owner("carol", "lhcb_user"), _Owner("lhcbprod", "lhcb_prod"))


def _job_for(node: dict[str, Any], rng: random.Random) -> tuple[JobRequirements, int]:
    """Random requirements that the given node satisfies."""
    owner = rng.choice(OWNERS)
    procs = rng.choice([p for p in (1, 2, 4, 8) if p <= node["processors"]])
    memory = rng.choice([m for m in (0, 2000, 4000) if m <= node["memory"] * 0.85])
    cpu = rng.choice([c for c in (3000, 80000) if c <= node["cpu_time"]])
    node_tags = node["tags"] if isinstance(node["tags"], list) else ["GPU"]
    tags = set(node.get("required_tags", []))
    if node_tags and rng.random() < 0.5:
        tags.add(rng.choice(node_tags))
    sites: frozenset[str] = frozenset()
    if rng.random() < 0.2:
        sites = frozenset({node["site"], rng.choice(SITES)})
    banned = frozenset({s for s in SITES if s not in sites and s != node["site"]}
                       if rng.random() < 0.1 else set())
    req = JobRequirements(
        vo=VO, owner=owner.name, owner_group=owner.group, cpu_time=cpu, processors=procs,
        memory=memory, job_type="MCSimulation" if owner.group == "lhcb_prod" else "User",
        sites=sites, banned_sites=banned,
        platforms=frozenset({node["platform"]}) if rng.random() < 0.7 else frozenset(),
        tags=frozenset(tags),
    )
    return req, rng.randint(0, 10)


def run_demo(settings: Settings, work: Path, *, n_jobs: int, seed: int,
             echo: Callable[[str], None]) -> None:
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    db_file = work / "demo.db"
    for leftover in work.glob("demo.db*"):
        leftover.unlink()
    settings = replace(settings, database=replace(settings.database, url=f"sqlite:///{db_file}"))
    engine = make_engine(settings.database.url)
    schema.upgrade(engine)
    factory = make_session_factory(engine)
    echo(f"gridpilot demo: SQLite database {db_file}, schema {schema.current_revision(engine)}")

    # 1. Submit: jobs arrive (Received), pass the checks (Checking), wait in task queues.
    # Users submit in campaigns of alike jobs: a few dozen kinds of job, some far more popular.
    kinds = [_job_for(NODES[name], rng) for name in NODES for _ in range(10)]
    popularity = [1 / (rank + 1) for rank in range(len(kinds))]
    rng.shuffle(kinds)
    t0 = time.perf_counter()
    for start in range(0, n_jobs, 1000):
        size = min(1000, n_jobs - start)
        batch = [(req, rng.randint(0, 10))
                 for req, _ in rng.choices(kinds, weights=popularity, k=size)]
        now = datetime.now(UTC)
        with factory.begin() as session:
            ids = add_jobs(session, [NewJob(f"[Executable = \"demo.sh\"; JobName = \"demo-{i}\"]",
                                            req, prio) for i, (req, prio) in enumerate(batch)],
                           now=now)
            apply_transition(session, ids, JobStatus.RECEIVED, JobStatus.CHECKING,
                             minor_status="Job sanity", source="demo", now=now)
            enqueue_jobs(session, [QueueEntry(i, req, prio) for i, (req, prio) in
                                   zip(ids, batch, strict=True)], settings, now=now, rng=rng)
    elapsed = time.perf_counter() - t0
    with factory() as session:
        n_tq = session.scalar(select(func.count()).select_from(TaskQueue))
    echo(f"\nSubmitted {n_jobs} jobs into {n_tq} task queues in {elapsed:.2f} s "
         f"({n_jobs / elapsed:,.0f} jobs/s).")
    _print_queues(factory, echo)

    # 2. Match: each kind of node asks in turn for up to as many jobs as it has cores.
    resources = {name: parse_resource(desc) for name, desc in NODES.items()}
    with factory() as session:
        echo("\nWhat each node could run before matching starts:")
        for name, res in resources.items():
            counts = matching_queues(session, res)
            echo(f"  {name:<18} {len(counts):>3} task queues, "
                 f"{sum(c.waiting for c in counts):>5} waiting jobs")
    matched: Counter[str] = Counter()
    requests: Counter[str] = Counter()
    first_groups: Counter[str] = Counter()
    active = dict(resources)
    t0 = time.perf_counter()
    pilot_no = 0
    while active:
        for name, res in list(active.items()):
            pilot_no += 1
            pilot = replace(res, pilot_reference=f"demo-pilot-{pilot_no}")
            with factory.begin() as session:
                claims = claim_jobs(session, pilot, now=datetime.now(UTC),
                                    count=res.processors or 1, rng=rng)
                if claims and sum(first_groups.values()) < 1000:
                    for group in session.scalars(select(Job.owner_group).where(
                            Job.id.in_([c.job_id for c in claims]))):
                        first_groups[group] += 1
            requests[name] += 1
            if claims:
                matched[name] += len(claims)
            else:
                del active[name]
    elapsed = time.perf_counter() - t0
    total = sum(matched.values())
    echo(f"\nMatched {total} jobs in {sum(requests.values())} requests in {elapsed:.2f} s "
         f"({total / elapsed:,.0f} jobs/s):")
    _print_resources(resources, matched, requests, echo)
    echo(_fair_share_line(first_groups, settings))
    with factory() as session:
        left = session.scalar(select(func.count()).select_from(TaskQueueJob)) or 0
        by_status = {status: n for status, n in session.execute(
            select(Job.status, func.count()).group_by(Job.status))}
    echo(f"\nJobs by status: {', '.join(f'{s} {n}' for s, n in sorted(by_status.items()))}; "
         f"left waiting: {left}.")
    if left:
        raise SystemExit(f"{left} jobs could not be matched by any node of the demo grid")


def _print_queues(factory: Any, echo: Callable[[str], None]) -> None:
    with factory() as session:
        echo("\nThe 8 largest task queues:")
        echo(queue_table(session, 8))


def _print_resources(resources: dict[str, Resource], matched: Counter[str],
                     requests: Counter[str], echo: Callable[[str], None]) -> None:
    echo(f"  {'node':<18} {'requests':>8} {'jobs':>6}")
    for name in resources:
        echo(f"  {name:<18} {requests[name]:>8} {matched[name]:>6}")


def _fair_share_line(groups: Counter[str], settings: Settings) -> str:
    total = sum(groups.values()) or 1
    parts = [f"{g} {100 * n / total:.0f}% (share {settings.share_of(g):g})"
             for g, n in sorted(groups.items())]
    return f"  first {total} jobs handed out, by owner group: {', '.join(parts)}"
