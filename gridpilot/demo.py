"""``make demo``: a small grid's users submit JDLs; the optimizer chain puts them in task
queues; pilots of five queues of ``conf/resources.toml`` drain them.

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

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gridpilot import schema
from gridpilot.reports import queue_table
from optimizers.chain import ChainContext, Identity, Submission, submissions_from_text, submit
from optimizers.classads import expression_check
from optimizers.queueresources import resource_for_queue
from optimizers.resources import ResourcesConfig, load_resources
from taskqueue.database import make_engine, make_session_factory
from taskqueue.matching import claim_jobs
from taskqueue.models import Job, TaskQueueJob
from taskqueue.settings import Settings
from taskqueue.submitpools import get_submit_pools_for_queue

VO = "lhcb"
SUBMITTERS = (Identity(VO, "alice", "lhcb_user"), Identity(VO, "bob", "lhcb_user"),
              Identity(VO, "carol", "lhcb_user"), Identity(VO, "lhcbprod", "lhcb_prod"))


@dataclass(frozen=True)
class Node:
    """A queue of the resources file whose pilots ask for work in the demo."""

    label: str
    site: str
    ce: str
    queue: str


NODES = (
    Node("CERN 1-core", "LCG.CERN.cern", "ce503.cern.ch", "condor"),
    Node("CERN ARM", "LCG.CERN.cern", "ce-arm01.cern.ch", "arm64"),
    Node("CNAF 8-core", "LCG.CNAF.it", "ce01-htc.cr.cnaf.infn.it", "htc_mcore"),
    Node("RAL GPU", "LCG.RAL.uk", "arc-ce01.gridpp.rl.ac.uk", "gpu"),
    Node("RAL 1-core", "LCG.RAL.uk", "arc-ce01.gridpp.rl.ac.uk", "grid"),
)

#: Kinds of job the demo's users submit (JDL bodies), each runnable by some node above; the
#: last asks for software no site has, so the optimizer chain fails it with the reason.
KINDS = (
    'Executable = "sim.sh"; Arguments = "--events 500"; CPUTime = 3600; MaxRAM = 1500',
    'Executable = "sim.sh"; CPUTime = 20000; Site = {"LCG.CERN.cern", "LCG.RAL.uk"}',
    'Executable = "ana.sh"; CPUTime = 7200; BannedSite = "LCG.CNAF.it"; '
    'Requirements = [ SoftwareTag = "VO-lhcb-davinci-v46" ]',
    'Executable = "reco.sh"; CPUTime = 3600; Requirements = [ SoftwareTag = "VO-lhcb-moore-v55";'
    ' MaxRAM = 3000 ]',
    'Executable = "mc.sh"; NumberOfProcessors = 8; MaxRAM = 12000; Tags = {"MultiProcessor"}; '
    'CPUTime = 80000',
    'Executable = "train.py"; Tags = {"GPU"}; NumberOfProcessors = 2; MaxRAM = 6000',
    'Executable = "arm.sh"; Platform = "aarch64-el9"; NumberOfProcessors = 4; CPUTime = 3600',
    'Executable = "fit.sh"; CPUTime = 1800; '
    'Requirements = other.MaxRAM >= 8000 && member("aarch64-el9", other.Platform)',
    'Executable = "old.sh"; Requirements = [ SoftwareTag = "VO-lhcb-gauss-v99" ]',
)


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
    grid = load_resources(Path(settings.resources.file))
    echo(f"gridpilot demo: SQLite database {db_file}, schema {schema.current_revision(engine)}, "
         f"resources {settings.resources.file} ({sum(1 for _ in grid.queues())} queues)")

    waiting, _failed = _submit_all(factory, settings, grid, n_jobs, rng, echo)
    with factory() as session:
        echo("\nThe 8 largest task queues:")
        echo(queue_table(session, 8))
    matched = _drain(factory, grid, rng, echo)
    with factory() as session:
        left = session.scalar(select(func.count()).select_from(TaskQueueJob)) or 0
        by_status = {status: n for status, n in session.execute(
            select(Job.status, func.count()).group_by(Job.status))}
    echo(f"\nJobs by status: {', '.join(f'{s} {n}' for s, n in sorted(by_status.items()))}; "
         f"left waiting: {left}.")
    if left or matched != waiting:
        raise SystemExit(f"{left} jobs could not be matched by any node of the demo grid")


def _submit_all(factory: sessionmaker[Session], settings: Settings, grid: ResourcesConfig,
                n_jobs: int, rng: random.Random, echo: Callable[[str], None]
                ) -> tuple[int, int]:
    """Users submit JDLs in campaigns; the chain runs inline, a thousand jobs a transaction."""
    popularity = [1 / (rank + 1) for rank in range(len(KINDS))]
    t0 = time.perf_counter()
    waiting = 0
    reasons: Counter[str] = Counter()
    submitted = 0
    campaign = 0
    while submitted < n_jobs:
        who = rng.choice(SUBMITTERS)
        size = min(20 if campaign < len(KINDS) else rng.choice((20, 50, 100)),
                   n_jobs - submitted)
        # every kind once, then the popular ones more often
        kind = KINDS[campaign] if campaign < len(KINDS) else rng.choices(KINDS, popularity)[0]
        campaign += 1
        jdl = f'[ {kind}; JobName = "{who.owner}-%n"; Parameters = {size}; ' \
              f'Priority = {rng.randint(0, 5)} ]'
        subs: list[Submission] = submissions_from_text(jdl, "jdl")
        with factory.begin() as session:
            result = submit(session, subs, who,
                            ChainContext(settings, grid, datetime.now(UTC), rng))
        waiting += len(result.waiting)
        reasons.update(result.failed.values())
        submitted += size
    elapsed = time.perf_counter() - t0
    echo(f"\nSubmitted {n_jobs} jobs as parametric JDLs in {elapsed:.2f} s "
         f"({n_jobs / elapsed:,.0f} jobs/s through the optimizer chain): {waiting} waiting, "
         f"{sum(reasons.values())} failed.")
    for reason, n in reasons.most_common():
        echo(f"  {n} failed: {reason}")
    return waiting, sum(reasons.values())


def _drain(factory: sessionmaker[Session], grid: ResourcesConfig, rng: random.Random,
           echo: Callable[[str], None]) -> int:
    """Pilots of each node ask in turn for as many jobs as they have cores, until none gets
    any."""
    matched: Counter[str] = Counter()
    requests: Counter[str] = Counter()
    active = list(NODES)
    t0 = time.perf_counter()
    pilot_no = 0
    while active:
        for node in list(active):
            pilot_no += 1
            with factory.begin() as session:
                pools = get_submit_pools_for_queue(session, node.site, node.ce, node.queue)
                resource = resource_for_queue(grid, node.site, node.ce, node.queue, VO,
                                              submit_pools=pools,
                                              pilot_reference=f"demo-pilot-{pilot_no}")
                claims = claim_jobs(session, resource, now=datetime.now(UTC),
                                    count=resource.processors or 1, rng=rng,
                                    expression_check=expression_check(resource))
            requests[node.label] += 1
            matched[node.label] += len(claims)
            if not claims:
                active.remove(node)
    elapsed = time.perf_counter() - t0
    total = sum(matched.values())
    echo(f"\nPilots of five queues matched {total} jobs in {sum(requests.values())} requests "
         f"in {elapsed:.2f} s ({total / elapsed:,.0f} jobs/s):")
    echo(f"  {'node':<12} {'queue':<45} {'requests':>8} {'jobs':>6}")
    for node in NODES:
        echo(f"  {node.label:<12} {node.site + '/' + node.ce + '/' + node.queue:<45} "
             f"{requests[node.label]:>8} {matched[node.label]:>6}")
    return total
