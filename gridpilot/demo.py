"""``make demo``: a small grid's users submit JDLs over HTTP; the optimizer chain puts them in
task queues; pilots of five queues of ``conf/resources.toml`` match them over HTTP with tokens,
report them running and done; the matcher runs under gunicorn on loopback.

Everything runs on an SQLite file in the work folder. Until the pilot program lands, the pilots
here are scripted clients speaking the pilot protocol.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import func, select

from gridpilot import schema
from gridpilot.devserver import matcher_server
from gridpilot.reports import queue_table
from matcher.auth import issue_token
from optimizers.chain import Identity
from optimizers.queueresources import queue_resource_data
from optimizers.resources import ResourcesConfig, load_resources
from pilot import protocol
from taskqueue.database import make_engine, make_session_factory
from taskqueue.models import Job, TaskQueueJob
from taskqueue.settings import Settings

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
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    db_file = work / "demo.db"
    for leftover in work.glob("demo.db*"):
        leftover.unlink()
    secret = secrets.token_urlsafe(32)
    resources_file = Path(settings.resources.file).resolve()
    settings = replace(settings, database=replace(settings.database, url=f"sqlite:///{db_file}"))
    engine = make_engine(settings.database.url)
    schema.upgrade(engine)
    factory = make_session_factory(engine)
    grid = load_resources(resources_file)
    echo(f"gridpilot demo: SQLite database {db_file}, schema {schema.current_revision(engine)}, "
         f"resources {settings.resources.file} ({sum(1 for _ in grid.queues())} queues)")
    with matcher_server(settings.database.url, secret, resources_file, work) as base:
        echo(f"Matcher: gunicorn with 2 workers at {base}")
        waiting = _submit_all(base, secret, n_jobs, rng, echo)
        with factory() as session:
            echo("\nThe 8 largest task queues:")
            echo(queue_table(session, 8))
        done = _drain(base, secret, grid, echo)
        operator = issue_token(secret, subject="demo-operator", role="operator", vo=VO,
                               group="lhcb_admin", lifetime=600)
        metrics = requests.get(f"{base}/metrics", timeout=30,
                               headers={"Authorization": f"Bearer {operator}"}).text
    echo("\nFrom the matcher's /metrics:")
    for line in metrics.splitlines():
        if line.startswith(("gridpilot_match_requests_total", "gridpilot_jobs_matched_total",
                            "gridpilot_no_matches_total")):
            echo(f"  {line}")
    with factory() as session:
        left = session.scalar(select(func.count()).select_from(TaskQueueJob)) or 0
        by_status = {status: n for status, n in session.execute(
            select(Job.status, func.count()).group_by(Job.status))}
    echo(f"\nJobs by status: {', '.join(f'{s} {n}' for s, n in sorted(by_status.items()))}; "
         f"left waiting: {left}.")
    if left or done != waiting:
        raise SystemExit(f"{left} jobs could not be matched by any node of the demo grid")


def _submit_all(base: str, secret: str, n_jobs: int, rng: random.Random,
                echo: Callable[[str], None]) -> int:
    """Users submit parametric JDLs in campaigns over HTTP, each with their own token."""
    sessions = {}
    for who in SUBMITTERS:
        http = requests.Session()
        token = issue_token(secret, subject=who.owner, role="user", vo=who.vo,
                            group=who.owner_group, lifetime=3600)
        http.headers.update({"Authorization": f"Bearer {token}", "Content-Type": "text/plain"})
        sessions[who] = http
    popularity = [1 / (rank + 1) for rank in range(len(KINDS))]
    t0 = time.perf_counter()
    statuses: Counter[str] = Counter()
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
        response = sessions[who].post(f"{base}/api/v1/jobs", data=jdl.encode(), timeout=60)
        if response.status_code != 201:
            raise SystemExit(f"submission refused: {response.status_code} {response.text}")
        for job in response.json()["jobs"]:
            statuses[job["status"]] += 1
            if job["status"] == "Failed":
                reasons[job["minor_status"]] += 1
        submitted += size
    elapsed = time.perf_counter() - t0
    echo(f"\nSubmitted {n_jobs} jobs as {campaign} parametric JDLs over HTTP in {elapsed:.2f} s "
         f"({n_jobs / elapsed:,.0f} jobs/s through the optimizer chain): "
         f"{statuses['Waiting']} waiting, {statuses['Failed']} failed.")
    for reason, n in reasons.most_common():
        echo(f"  {n} failed: {reason}")
    return statuses["Waiting"]


@dataclass
class _Tally:
    requests: int = 0
    jobs: int = 0
    done: int = 0
    no_match: str = ""


def _drain(base: str, secret: str, grid: ResourcesConfig, echo: Callable[[str], None]) -> int:
    """One scripted pilot per node at a time, all nodes at once: each pilot registers, asks for
    its SubmitPools, then for as many jobs as it has cores, reports each Running then Done,
    and the next pilot of the node starts, until a pilot gets no job."""
    tallies = {node: _Tally() for node in NODES}
    t0 = time.perf_counter()
    threads = [threading.Thread(target=_node_pilots, args=(base, secret, grid, node,
                                                           tallies[node]))
               for node in NODES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - t0
    total = sum(t.jobs for t in tallies.values())
    calls = sum(t.requests for t in tallies.values())
    echo(f"\nScripted pilots of five queues matched {total} jobs and reported them done in "
         f"{elapsed:.2f} s ({calls} HTTP requests, {calls / elapsed:,.0f}/s):")
    echo(f"  {'node':<12} {'site/CE/queue':<45} {'requests':>8} {'jobs':>6} {'done':>6}  "
         "last answer")
    for node, t in tallies.items():
        echo(f"  {node.label:<12} {node.site + '/' + node.ce + '/' + node.queue:<45} "
             f"{t.requests:>8} {t.jobs:>6} {t.done:>6}  {t.no_match}")
    return sum(t.done for t in tallies.values())


def _node_pilots(base: str, secret: str, grid: ResourcesConfig, node: Node,
                 tally: _Tally) -> None:
    token = issue_token(secret, subject=f"demo-{node.queue}", role="pilot", vo=VO,
                        group="lhcb_pilot", lifetime=3600, site=node.site)
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {token}"
    api = base + protocol.API_PREFIX
    number = 0
    while True:
        number += 1
        reference = f"demo-{node.queue}-{number}"
        _call(http, tally, "PUT", api + protocol.PILOT_PATH.format(reference=reference),
              {"site": node.site, "ce": node.ce, "queue": node.queue, "status": "Running"})
        pools = _call(http, tally, "GET", api + protocol.SUBMIT_POOLS_PATH, None,
                      {"site": node.site, "ce": node.ce, "queue": node.queue})["submit_pools"]
        resource = queue_resource_data(grid, node.site, node.ce, node.queue, VO,
                                       submit_pools=pools, pilot_reference=reference)
        answer = _call(http, tally, "POST", api + protocol.MATCH_PATH,
                       {"resource": resource, "count": resource.get("processors", 1)})
        if not answer["jobs"]:
            tally.no_match = answer["no_match"]["reason"]
            _call(http, tally, "PUT", api + protocol.PILOT_PATH.format(reference=reference),
                  {"site": node.site, "ce": node.ce, "queue": node.queue, "status": "Done"})
            return
        tally.jobs += len(answer["jobs"])
        for job in answer["jobs"]:
            path = api + protocol.JOB_STATUS_PATH.format(job_id=job["job_id"])
            _call(http, tally, "POST", path,
                  {"pilot_reference": reference, "status": protocol.RUNNING})
            done = _call(http, tally, "POST", path, {
                "pilot_reference": reference, "status": protocol.DONE, "exit_code": 0,
                "output_tail": f"{job['executable']} {' '.join(job['arguments'])}: ok\n"})
            tally.done += done["status"] == protocol.DONE


def _call(http: requests.Session, tally: _Tally, method: str, url: str,
          body: dict[str, Any] | None, params: dict[str, str] | None = None) -> Any:
    tally.requests += 1
    response = http.request(method, url, json=body, params=params, timeout=60)
    if response.status_code != 200:
        raise SystemExit(f"{method} {url}: {response.status_code} {response.text}")
    return response.json()
