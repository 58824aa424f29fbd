"""``make demo``: a small grid driven by the site director.

Users submit parametric JDLs over HTTP to the matcher (gunicorn on loopback); the optimizer
chain puts them in task queues; the site director sees which of six queues of
``conf/resources.toml`` could run the waiting work and starts real pilots for them through
PSI/J's ``local`` executor, each with generated machine/job features directories; the pilots
match jobs over HTTP with their own tokens, run the payloads, report them and keep their
``$JOBSTATUS`` current; the site admin's drain-cost table is printed while they work and at the
end. Everything runs on this machine, on an SQLite file in the work folder: each queue's pilots
stand in for that site's worker nodes. The dashboard (/ui/) is served by the same matcher; the
demo prints its address and an operator's token, and keeps its counters as the activity loop
would. One job takes local files in (uploaded as its input sandbox) and brings a file back,
which the demo prints, fetched through the API.
"""

from __future__ import annotations

import logging
import random
import secrets
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import func, select

from agents.context import AgentContext
from agents.director import Director, compute_elements
from agents.pilotstatus import PilotFollower
from client.sandboxes import fetch_output, with_uploaded_inputs
from client.sandboxes import upload as upload_sandbox
from client.service import Service
from gridpilot import schema
from gridpilot.devserver import matcher_server
from gridpilot.reports import queue_table
from matcher.auth import issue_token
from optimizers.chain import Identity
from pilot.features import write_features
from taskqueue.core.settings import Settings
from taskqueue.core.states import FINAL_STATES
from taskqueue.db.database import make_engine, make_session_factory
from taskqueue.db.models import Job, Pilot, TaskQueueJob
from taskqueue.files.sandboxstore import S3Store
from taskqueue.pilots.activity import record_activity

VO = "lhcb"
SUBMITTERS = (Identity(VO, "alice", "lhcb_user"), Identity(VO, "bob", "lhcb_user"),
              Identity(VO, "carol", "lhcb_user"), Identity(VO, "lhcbprod", "lhcb_prod"))


@dataclass(frozen=True)
class Node:
    """A queue of the resources file whose pilots the demo's director starts."""

    label: str
    site: str
    ce: str
    queue: str
    cores: int
    hs06: float


NODES = (
    Node("CERN 1-core", "LCG.CERN.cern", "ce503.cern.ch", "condor", 1, 12.0),
    Node("CERN ARM", "LCG.CERN.cern", "ce-arm01.cern.ch", "arm64", 4, 9.0),
    Node("CNAF 8-core", "LCG.CNAF.it", "ce01-htc.cr.cnaf.infn.it", "htc_mcore", 8, 11.0),
    Node("RAL GPU", "LCG.RAL.uk", "arc-ce01.gridpp.rl.ac.uk", "gpu", 4, 14.0),
    Node("RAL 1-core", "LCG.RAL.uk", "arc-ce01.gridpp.rl.ac.uk", "grid", 1, 10.0),
    # The resources file's own local site (its CE has Executor = "local" already).
    Node("Demo local", "DIRAC.Demo.local", "localhost", "local", 1, 1.0),
)

#: A payload: says what it is and works for a moment.
_RUN = ('Executable = "/bin/sh"; '
        'Arguments = "-c \'echo {what} %n on $(hostname); sleep 0.3\'"')

#: Kinds of job the demo's users submit (JDL bodies), each runnable by some node above; the
#: last asks for software no site has, so the optimizer chain fails it with the reason.
KINDS = (
    _RUN.format(what="simulation") + '; CPUTime = 3600; MaxRAM = 1500',
    _RUN.format(what="simulation") + '; CPUTime = 20000; Site = {"LCG.CERN.cern", "LCG.RAL.uk"}',
    _RUN.format(what="analysis") + '; CPUTime = 7200; BannedSite = "LCG.CNAF.it"; '
    'Requirements = [ SoftwareTag = "VO-lhcb-davinci-v46" ]',
    _RUN.format(what="reconstruction") + '; CPUTime = 3600; '
    'Requirements = [ SoftwareTag = "VO-lhcb-moore-v55"; MaxRAM = 3000 ]',
    _RUN.format(what="multicore-mc") + '; NumberOfProcessors = 8; MaxRAM = 12000; '
    'Tags = {"MultiProcessor"}; CPUTime = 80000',
    _RUN.format(what="training") + '; Tags = {"GPU"}; NumberOfProcessors = 2; MaxRAM = 6000',
    _RUN.format(what="arm-build") + '; Platform = "aarch64-el9"; NumberOfProcessors = 4; '
    'CPUTime = 3600',
    _RUN.format(what="fit") + '; CPUTime = 1800; '
    'Requirements = other.MaxRAM >= 8000 && member("aarch64-el9", other.Platform)',
    _RUN.format(what="legacy") + '; Requirements = [ SoftwareTag = "VO-lhcb-gauss-v99" ]',
)


def run_demo(settings: Settings, work: Path, *, n_jobs: int, seed: int,
             echo: Callable[[str], None], linger: float = 0.0) -> None:
    """The demo; with ``linger`` seconds, the matcher (and its dashboard) stays up that long
    after the pilots have finished, or until Ctrl-C."""
    rng = random.Random(seed)
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    db_file = work / "demo.db"
    for leftover in work.glob("demo.db*"):
        leftover.unlink()
    for folder in ("pilots", "jobstatus", "features", "metrics", "sandboxes", "sandbox-demo"):
        shutil.rmtree(work / folder, ignore_errors=True)
    secret = secrets.token_urlsafe(32)
    resources_file = demo_resources(Path(settings.resources.file), work)
    settings = replace(
        settings, database=replace(settings.database, url=f"sqlite:///{db_file}"),
        resources=replace(settings.resources, file=str(resources_file)),
        auth=replace(settings.auth, secret=secret, secret_file=""),
        agents=replace(settings.agents, vo=VO, pilot_workdir=str(work / "pilots"),
                       pilot_idle_timeout=3, pilots_per_cycle=4, director_interval=1))
    engine = make_engine(settings.database.url)
    schema.upgrade(engine)
    factory = make_session_factory(engine)
    echo(f"gridpilot demo: SQLite database {db_file}, schema {schema.current_revision(engine)}, "
         f"resources {resources_file} (its {len(NODES)} queues of the pilots table below get "
         "pilots through PSI/J's local executor, with generated machine/job features)")
    with matcher_server(settings.database.url, secret, resources_file, work) as base:
        echo(f"Matcher: gunicorn with 2 workers at {base}")
        _announce_dashboard(base, secret, linger, echo)
        settings = replace(settings, matcher=replace(settings.matcher, url=base))
        if settings.sandboxes.backend == "s3":
            S3Store(settings.sandboxes).ensure_bucket()
        sandbox_job = _submit_with_files(base, secret, work / "sandbox-demo", echo)
        waiting = _submit_all(base, secret, n_jobs, rng, echo) + 1
        by_client, psij_job, psij_states = _submit_as_a_user(base, secret, work, echo)
        waiting += by_client
        with factory() as session:
            echo("\nThe 8 largest task queues:")
            echo(queue_table(session, 8))
        _direct(settings, factory, work, echo)
        _show_user_jobs(base, work, psij_job, psij_states, echo)
        _summary(factory, work, waiting, echo)
        _show_output(base, secret, sandbox_job, work / "sandbox-demo", echo)
        _linger(base, linger, echo)


def demo_resources(source: Path, work: Path) -> Path:
    """The resources file with the demo's queues made local: each gets
    ``Executor = "local"``, small pilot caps, and generated machine/job features."""
    lines = source.read_text(encoding="utf-8").splitlines()
    for node in NODES:
        # The CE's name quoted (it has dots) or bare.
        at = next(i for i, line in enumerate(lines) if line in (
            f'[Sites."{node.site}".CEs."{node.ce}".Queues.{node.queue}]',
            f'[Sites."{node.site}".CEs.{node.ce}.Queues.{node.queue}]'))
        features = work / "features" / node.queue
        write_features(features / "machine", {
            "hs06": node.hs06 * 8, "jobslots": 8 // node.cores, "phys_cores": 8,
            "log_cores": 8})
        write_features(features / "job", {
            "allocated_CPU": node.cores, "cpufactor_lrms": node.hs06,
            "wall_limit_secs_lrms": 86400, "wall_limit_secs": int(86400 * node.hs06),
            "mem_limit_MB": 2000 * node.cores})
        added = ['Executor = "local"', "MaxWaitingPilots = 2", "MaxTotalPilots = 3",
                 f'MachineFeatures = "{features / "machine"}"',
                 f'JobFeatures = "{features / "job"}"',
                 f'JobStatusRoot = "{work / "jobstatus"}"']
        lines[at + 1:at + 1] = added
    target = work / "resources.toml"
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return target


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


def _client(base: str, work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``gridpilot-client`` as a user runs it (the script beside this Python, else the
    module)."""
    script = Path(sys.executable).parent / "gridpilot-client"
    command = ([str(script)] if script.is_file()
               else [sys.executable, "-c", "from client.cli import main; main()"])
    return subprocess.run([*command, "--url", base, "--token-file", str(work / "dave.token"),
                           *args], capture_output=True, text=True, timeout=120)


def _submit_as_a_user(base: str, secret: str, work: Path, echo: Callable[[str], None]
                      ) -> tuple[int, Any, list[str]]:
    """A user submits with gridpilot-client, and a workflow system through the PSI/J
    executor; the jobs run among the others."""
    import psij

    from client.psij_executor import GridpilotExecutorConfig  # registers the executor

    (work / "dave.token").write_text(issue_token(secret, subject="dave", role="user", vo=VO,
                                                 group="lhcb_user", lifetime=3600))
    (work / "hello.jdl").write_text('[ Executable = "/bin/echo"; Arguments = "hello from '
                                    'gridpilot-client"; JobName = "hello-%n"; '
                                    'Parameters = 2; ]\n')
    out = _client(base, work, "submit", str(work / "hello.jdl"))
    if out.returncode != 0:
        raise SystemExit(f"gridpilot-client submit failed: {out.stderr}")
    ids = out.stdout.split()
    echo(f"\ngridpilot-client submit hello.jdl (as dave): jobs {', '.join(ids)}")
    executor = psij.JobExecutor.get_instance(
        "gridpilot", url=base,
        config=GridpilotExecutorConfig(token_file=str(work / "dave.token"), poll_interval=1))
    states: list[str] = []
    executor.set_job_status_callback(lambda job, status: states.append(status.state.name))
    job = psij.Job(psij.JobSpec("/bin/sh", ["-c", "echo hello from PSI/J on $(hostname)"],
                                name="psij-hello", stdout_path=work / "psij-hello.txt"))
    executor.submit(job)
    echo(f"PSI/J: JobExecutor.get_instance('gridpilot').submit(job): native id "
         f"{job.native_id}, {job.status.state.name}")
    return len(ids) + 1, job, states


def _show_user_jobs(base: str, work: Path, job: Any, states: list[str],
                    echo: Callable[[str], None]) -> None:
    import psij

    status = job.wait(timeout=timedelta(seconds=60))
    echo(f"\nThe PSI/J job {job.native_id}: {' -> '.join(states)} (exit code "
         f"{status.exit_code if status else '?'}); its output: "
         f"{(work / 'psij-hello.txt').read_text().strip()!r}")
    if status is None or status.state != psij.JobState.COMPLETED:
        raise SystemExit(f"the PSI/J job did not complete: {status}")
    listed = _client(base, work, "list", "--name", "hello-*")
    echo("gridpilot-client list --name 'hello-*':\n" + listed.stdout.rstrip())


#: The job that takes files in and brings one back (sandboxes).
SANDBOX_JDL = """[
    Executable = "/bin/sh";
    Arguments = "count.sh";
    InputSandbox = {"count.sh", "cities.txt"};
    OutputSandbox = {"result.txt"};
    JobName = "sandbox-demo";
]
"""
COUNT_SH = """#!/bin/sh
{ echo "$(wc -l < cities.txt) cities, sorted on $(hostname):"; sort cities.txt; } > result.txt
"""


def _alice(base: str, secret: str) -> Service:
    who = SUBMITTERS[0]
    return Service(base, issue_token(secret, subject=who.owner, role="user", vo=who.vo,
                                     group=who.owner_group, lifetime=3600))


def _submit_with_files(base: str, secret: str, folder: Path,
                       echo: Callable[[str], None]) -> int:
    """Alice submits a job with local input files, as gridpilot-client submit does: the files
    are packed, uploaded (checksum first) and replaced by their sandbox id."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cities.txt").write_text("Geneva\nBologna\nDidcot\nKarlsruhe\nLyon\n",
                                       encoding="utf-8")
    (folder / "count.sh").write_text(COUNT_SH, encoding="utf-8")
    service = _alice(base, secret)
    text = with_uploaded_inputs(SANDBOX_JDL, "jdl", folder,
                                lambda data: upload_sandbox(service, data))
    job = service.submit(text, "jdl")["jobs"][0]
    sandbox = service.output(job["job_id"])["input_sandboxes"]
    echo(f"\nalice submitted job {job['job_id']} with the local files count.sh and cities.txt,"
         f" uploaded as input sandbox {', '.join(sandbox)} ({job['status']}).")
    return int(job["job_id"])


def _show_output(base: str, secret: str, job_id: int, folder: Path,
                 echo: Callable[[str], None]) -> None:
    """Alice reads the job's output file back through the API."""
    service = _alice(base, secret)
    answer = service.output(job_id)
    if answer["status"] != "Done" or not answer["output_sandbox"]:
        raise SystemExit(f"job {job_id} ended {answer['status']} without an output sandbox")
    fetch_output(service, answer["output_sandbox"], folder / "output")
    echo(f"\nJob {job_id}'s output sandbox {answer['output_sandbox']}, fetched through "
         "GET /api/v1/sandboxes; its result.txt says:")
    echo((folder / "output" / "result.txt").read_text(encoding="utf-8").rstrip())


def _direct(settings: Settings, factory: Any, work: Path,
            echo: Callable[[str], None]) -> None:
    """The site director's cycles, until every job has ended and every pilot has exited."""
    logging.getLogger("agents").setLevel(logging.WARNING)
    # PSI/J watches the local pilots every second; the pilots' end, output and folders are
    # followed each cycle, as the agents' pilots loop does.
    fast = replace(settings, agents=replace(settings.agents, pilot_status_interval=1))
    ctx = AgentContext(fast, factory, secret=settings.auth.secret)
    ces = compute_elements(ctx)
    director = Director(ctx, ces)
    follower = PilotFollower(ctx, ces)
    t0 = time.perf_counter()
    snapshot_taken = False
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        director.cycle()
        follower.turn()
        # What `gridpilot agents activity` does in production: the dashboard's counters.
        ctx.transaction(partial(record_activity, now=ctx.now()))
        with factory() as session:
            open_jobs = session.scalar(select(func.count()).select_from(Job).where(
                Job.status.not_in([s.value for s in FINAL_STATES]))) or 0
            alive = session.scalar(select(func.count()).select_from(Pilot).where(
                Pilot.status.in_(("Submitting", "Submitted", "Waiting", "Running")))) or 0
            busy = session.scalar(select(func.count()).select_from(Job).where(
                Job.status == "Running")) or 0
            followed = session.scalar(select(func.count()).select_from(Pilot).where(
                Pilot.log_state.is_(None), Pilot.native_id.is_not(None))) or 0
        if not snapshot_taken and busy >= 4:
            echo(f"\nWhile {busy} payloads run, the site admin asks what draining would cost "
                 "(gridpilot-drain-cost):")
            echo(_drain_cost(work))
            snapshot_taken = True
        if open_jobs == 0 and alive == 0 and followed == 0:
            ctx.transaction(partial(record_activity, now=ctx.now()))
            break
        time.sleep(1.0)
    else:
        raise SystemExit("the demo's pilots did not finish the jobs within 15 minutes")
    echo(f"\nThe site director's pilots ran every job in {time.perf_counter() - t0:.1f} s.")


# Without a terminal (CI, a pipe) the demo does not linger; this is how to make it.
KEEP_UP = "gridpilot demo --linger 600"


def _announce_dashboard(base: str, secret: str, linger: float,
                        echo: Callable[[str], None]) -> None:
    token = issue_token(secret, subject="demo-operator", role="operator", vo=VO,
                        group="lhcb_admin", lifetime=max(3600, int(linger) + 3600))
    after = (f"it stays up {linger:.0f} s after the pilots finish" if linger
             else f"it stops when the demo ends; {KEEP_UP} keeps it up 10 minutes")
    echo(f"\nDashboard: {base}/ui/ (sign in with the operator token below; {after}; "
         "Ctrl-C stops the demo):")
    echo(f"  {token}")


def _linger(base: str, linger: float, echo: Callable[[str], None]) -> None:
    if linger <= 0:
        echo(f"\nThe demo has ended: the matcher and its dashboard have stopped "
             f"({KEEP_UP} keeps them up 10 minutes after the pilots finish).")
        return
    try:  # a Ctrl-C as soon as the line is out stops the demo as well
        echo(f"\nThe dashboard stays at {base}/ui/ for {linger:.0f} s; press Ctrl-C to stop "
             "now.")
        time.sleep(linger)
    except KeyboardInterrupt:
        echo("Stopping.")


def _drain_cost(work: Path) -> str:
    out = subprocess.run([sys.executable, "-m", "pilot.draincost", "--root",
                          str(work / "jobstatus")], capture_output=True, text=True, timeout=60)
    return (out.stdout or out.stderr).rstrip()


def _summary(factory: Any, work: Path, waiting: int, echo: Callable[[str], None]) -> None:
    with factory() as session:
        by_queue = Counter({(site, ce, queue): n for site, ce, queue, n in session.execute(
            select(Pilot.site, Pilot.ce, Pilot.queue, func.count(Job.id))
            .join(Job, Job.pilot_reference == Pilot.reference)
            .where(Job.status == "Done").group_by(Pilot.site, Pilot.ce, Pilot.queue))})
        pilots = Counter({(site, ce, queue): n for site, ce, queue, n in session.execute(
            select(Pilot.site, Pilot.ce, Pilot.queue, func.count())
            .group_by(Pilot.site, Pilot.ce, Pilot.queue))})
        left = session.scalar(select(func.count()).select_from(TaskQueueJob)) or 0
        by_status = {status: n for status, n in session.execute(
            select(Job.status, func.count()).group_by(Job.status))}
    labels = {(n.site, n.ce, n.queue): n.label for n in NODES}
    echo(f"\nPilots the site director submitted, and the jobs they ran, per queue:\n"
         f"  {'node':<12} {'site/CE/queue':<48} {'pilots':>6} {'jobs done':>9}")
    for key in sorted(pilots):
        echo(f"  {labels.get(key, ''):<12} {'/'.join(key):<48} {pilots[key]:>6} "
             f"{by_queue[key]:>9}")
    echo(f"  {'total':<12} {'':<48} {sum(pilots.values()):>6} {sum(by_queue.values()):>9}")
    echo("\nAt the end, every pilot has exited (gridpilot-drain-cost):")
    echo(_drain_cost(work))
    echo(f"\nJobs by status: {', '.join(f'{s} {n}' for s, n in sorted(by_status.items()))}; "
         f"left waiting: {left}.")
    done = by_status.get("Done", 0)
    if left or done != waiting:
        raise SystemExit(f"{waiting - done} of {waiting} jobs did not end Done")
