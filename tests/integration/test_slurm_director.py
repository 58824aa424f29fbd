"""The site director's batch path against a REAL single-node Slurm, through PSI/J's ``slurm``
executor: pilots submitted with sbatch pull and run real jobs from a real matcher, and their
records follow Slurm's states through PSI/J's status callbacks.

Slurm comes from the project's ``tools/slurm-localhost``: CI starts it and exports SLURM_CONF;
otherwise the ``slurm`` fixture starts it. When it cannot be started the
tests are skipped locally, but fail where CI, GRIDPILOT_TEST_REQUIRE_SERVERS=1 or
GRIDPILOT_TEST_REQUIRE_SLURM=1 is set.

Slurm runs the pilots as root on this node, on the same filesystem, with this Python: the
pilots' work directories live in the test's tmp_path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import select

from agents.ce.base import ComputeElement
from agents.ce.config import CEConfig
from agents.ce.psij import PsijCE
from agents.ce.registry import ComputeElements
from agents.context import AgentContext
from agents.director import Director
from agents.pilotstatus import PilotFollower
from gridpilot.devserver import matcher_server
from taskqueue.core.settings import MatcherSettings, ResourcesSettings, Settings
from taskqueue.db.models import Pilot
from taskqueue.pilots.monitoring import pilots_stuck_since
from taskqueue.pilots.records import (
    FINAL_PILOT_STATES,
    PILOT_STATES,
    record_new_pilots,
    record_submission,
    set_pilot_status,
)
from taskqueue.tokens import issue_token
from tests.conftest import Database

ROOT = Path(__file__).resolve().parents[2]
SLURM_LOCALHOST = ROOT / "tools" / "slurm-localhost"
SECRET = "slurm-director-integration-secret-0123456789"
SITE, CE, QUEUE = "DIRAC.Slurm.local", "slurm-localhost", "batch"
WALL_MINUTES = 10
#: A Slurm job id no Slurm of this machine hands out (ids stop at 67,043,328 by default).
BOGUS_NATIVE_ID = "999999999"
PSIJ_FINAL = frozenset({"COMPLETED", "FAILED", "CANCELED"})

#: A payload that notes which Slurm job it ran in, then sleeps a little.
PAYLOAD = '''\
import os, sys, time
record, seconds = sys.argv[1], float(sys.argv[2])
time.sleep(seconds)
with open(record, "a") as f:
    f.write(f"{os.environ['GRIDPILOT_JOB_ID']} {os.environ.get('SLURM_JOB_ID', '-')}\\n")
print("payload ran in Slurm job", os.environ.get("SLURM_JOB_ID"))
'''

#: A stand-in for the pilot that contacts nobody, so that only Slurm (through PSI/J's
#: callbacks) moves its record: it sleeps, then exits with the code found in CODES/<its
#: reference> (0 when there is none). sh -c SCRIPT CODES --matcher ... --reference REF ...
FAKE_PILOT = '''\
sleep 6
codes=$0
while [ $# -gt 0 ]; do
  if [ "$1" = --reference ]; then ref=$2; fi
  shift
done
[ -f "$codes/$ref" ] && exit "$(cat "$codes/$ref")"
exit 0
'''


# -- Slurm ------------------------------------------------------------------------------------

def _slurm_required() -> bool:
    return any(os.environ.get(name) not in (None, "", "0") for name in (
        "CI", "GRIDPILOT_TEST_REQUIRE_SERVERS", "GRIDPILOT_TEST_REQUIRE_SLURM"))


def _run(*command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=ROOT)


def _sinfo_partition() -> str | None:
    """The default (else the first) partition that is up, or None when sinfo fails."""
    try:
        out = _run("sinfo", "-h", "-o", "%P %a")
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    up = [line.split()[0] for line in out.stdout.splitlines() if line.split()[1:] == ["up"]]
    default = [p.rstrip("*") for p in up if p.endswith("*")]
    return default[0] if default else up[0] if up else None


@pytest.fixture(scope="session")
def slurm() -> Iterator[str]:
    """A running Slurm (started with slurm-localhost unless SLURM_CONF already names one that
    answers); yields the partition pilots go to."""
    with pytest.MonkeyPatch.context() as mp:
        partition = _sinfo_partition() if os.environ.get("SLURM_CONF") else None
        if partition is None:
            problem = ""
            try:
                up = _run(str(SLURM_LOCALHOST), "up", timeout=900)
                if up.returncode != 0:
                    problem = f"exit code {up.returncode}: {up.stdout}{up.stderr}"
            except (OSError, subprocess.TimeoutExpired) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                message = f"{SLURM_LOCALHOST} up failed: {problem.strip()}"
                if _slurm_required():
                    pytest.fail(message)
                pytest.skip(message)
            line = _run(str(SLURM_LOCALHOST), "env").stdout.strip()
            found = re.fullmatch(r"export SLURM_CONF=(\S+)", line)
            assert found, f"{SLURM_LOCALHOST} env printed {line!r}"
            mp.setenv("SLURM_CONF", found.group(1))
            partition = _sinfo_partition()
            assert partition is not None, (
                f"Slurm started by {SLURM_LOCALHOST} does not answer sinfo: "
                f"{_run('sinfo').stderr}")
        yield partition


def scontrol_job(native_id: str) -> dict[str, str]:
    """``scontrol show job`` as a dict (Slurm keeps finished jobs for MinJobAge, 300 s)."""
    out = _run("scontrol", "-o", "show", "job", native_id)
    assert out.returncode == 0, f"scontrol show job {native_id}: {out.stdout}{out.stderr}"
    fields: dict[str, str] = {}
    for item in out.stdout.split():
        key, _, value = item.partition("=")
        fields.setdefault(key, value)
    return fields


def slurm_mb(value: str) -> float:
    """A Slurm memory figure ("0", "512M", "1.50G") in MB."""
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    if value[-1:] in units:
        return float(value[:-1]) * units[value[-1]]
    return float(value)


# -- the grid -----------------------------------------------------------------------------------

def resources_text(partition: str, *, cores: int = 1, memory_mb: int = 1024) -> str:
    return f'''\
[JobDescription]
VO = "list"
Platform = "list"
Tags = "list"
Executor = "string"
NumberOfProcessors = "number"
MaxRAM = "number"
MaxCPUTime = "number"

[Sites."{SITE}"]
VO = "lhcb"
HS06 = 1.0

[Sites."{SITE}".CEs."{CE}"]
Executor = "slurm"
BatchQueue = "{partition}"

[Sites."{SITE}".CEs."{CE}".Queues.{QUEUE}]
MaxCPUTime = 60
WallTime = {WALL_MINUTES}
NumberOfProcessors = {cores}
MaxRAM = {memory_mb}
MaxWaitingPilots = 5
'''


class RecordingPsijCE(PsijCE):
    """A PSI/J compute element that notes every status PSI/J reports to it."""

    def __init__(self, executor: str, workdir: Path, events: list[tuple[str, str]]) -> None:
        super().__init__(executor, workdir, polling_interval=1)
        self.events = events

    def _status_changed(self, job: Any, status: Any) -> None:
        reference = self._references.get(job.id)
        if reference is not None:
            self.events.append((reference, status.state.name))
        super()._status_changed(job, status)


class RecordingPool(ComputeElements):
    """The compute elements of an agent process, noting every status PSI/J reports, with the
    pilot-status loop that records them."""

    def __init__(self, ctx: AgentContext) -> None:
        super().__init__(Path(ctx.settings.agents.pilot_workdir).resolve(),
                         ctx.settings.agents)
        self.ctx = ctx
        self.events: list[tuple[str, str]] = []
        self.follower = PilotFollower(ctx, self)

    def get(self, config: CEConfig) -> ComputeElement:
        if config not in self._built and config.kind == "psij":
            self._built[config] = RecordingPsijCE(config.executor, self.workdir, self.events)
        return super().get(config)

    def follow(self) -> None:
        report = self.follower.turn()
        assert not report.failed, report.line()

    def states_of(self, reference: str) -> list[str]:
        return [state for ref, state in list(self.events) if ref == reference]

    def final_state(self, reference: str) -> str | None:
        """The final state PSI/J reported for the pilot, if it did yet."""
        final = [s for s in self.states_of(reference) if s in PSIJ_FINAL]
        return final[-1] if final else None


@dataclass
class SlurmGrid:
    base: str
    tmp: Path
    db: Database
    settings: Settings
    user: requests.Session
    script: Path
    record: Path
    #: Every pilot status seen in the database, per reference, in order (repeats dropped).
    seen: dict[str, list[str]] = field(default_factory=dict)

    def context(self, **agents: Any) -> AgentContext:
        s = replace(self.settings, agents=replace(self.settings.agents, **agents))
        return AgentContext(s, self.db.factory, secret=SECRET)

    def fake_pilot(self) -> dict[str, Any]:
        """Agent settings that start the stand-in pilot instead of the real one. It never
        reaches the matcher, by design: its ends are no failed starts that would stop the
        queue ([agents] failed_starts 0)."""
        codes = self.tmp / "codes"
        codes.mkdir(exist_ok=True)
        return {"pilot_command": ("/bin/sh", "-c", FAKE_PILOT, str(codes)), "failed_starts": 0}

    def set_exit_code(self, reference: str, code: int) -> None:
        (self.tmp / "codes" / reference).write_text(str(code))

    def submit(self, n: int, seconds: float = 2) -> list[int]:
        # 300 s: within what a pilot of a WALL_MINUTES limit at 1 HS06 offers (540 s).
        jdl = (f'[ Executable = "{sys.executable}"; '
               f'Arguments = "{self.script} {self.record} {seconds}"; CPUTime = 300; '
               f'Site = "{SITE}"' + (f"; Parameters = {n}" if n > 1 else "") + " ]")
        response = self.user.post(f"{self.base}/api/v1/jobs", data=jdl.encode(),
                                  headers={"Content-Type": "text/plain"}, timeout=30)
        assert response.status_code == 201, response.text
        ids: list[int] = response.json()["job_ids"]
        assert len(ids) == n
        return ids

    def job(self, job_id: int) -> dict[str, Any]:
        response = self.user.get(f"{self.base}/api/v1/jobs/{job_id}", timeout=30)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    def pilots(self) -> dict[str, Pilot]:
        with self.db.factory() as session:
            rows = session.scalars(select(Pilot).order_by(Pilot.id)).all()
            session.expunge_all()
        for p in rows:
            history = self.seen.setdefault(p.reference, [])
            if not history or history[-1] != p.status:
                history.append(p.status)
        return {p.reference: p for p in rows}

    def wait_pilots(self, until: Callable[[dict[str, Pilot]], bool], what: str,
                    timeout: float = 180, pool: RecordingPool | None = None
                    ) -> dict[str, Pilot]:
        """Wait until the pilot records hold ``until``, running ``pool``'s pilot-status loop
        meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            if pool is not None:
                pool.follow()
            pilots = self.pilots()
            if until(pilots):
                return pilots
            assert time.monotonic() < deadline, (
                f"timed out waiting for {what}: "
                f"{ {r: (p.status, p.native_id, p.reason) for r, p in pilots.items()} }")
            time.sleep(0.1)

    def pilot_log(self, reference: str) -> str:
        out = []
        for name in ("pilot.out", "pilot.err"):
            path = Path(self.settings.agents.pilot_workdir) / reference / name
            if path.exists():
                out.append(f"--- {path}\n{path.read_text(errors='replace')}")
        return "\n".join(out)


@pytest.fixture()
def grid(slurm: str, db: Database, settings: Settings, tmp_path: Path) -> Iterator[SlurmGrid]:
    resources = tmp_path / "resources.toml"
    resources.write_text(resources_text(slurm), encoding="utf-8")
    with matcher_server(db.url, SECRET, resources, tmp_path) as base:
        s = replace(settings, resources=ResourcesSettings(file=str(resources)),
                    matcher=MatcherSettings(url=base),
                    agents=replace(settings.agents, pilot_workdir=str(tmp_path / "pilots"),
                                   pilot_idle_timeout=3, failure_backoff=1))
        user = requests.Session()
        user.headers["Authorization"] = "Bearer " + issue_token(
            SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user", lifetime=3600)
        script = tmp_path / "payload.py"
        script.write_text(PAYLOAD, encoding="utf-8")
        g = SlurmGrid(base, tmp_path, db, s, user, script, tmp_path / "record.txt")
        try:
            with user:
                yield g
        finally:
            # Leave no pilot of this test in Slurm (only its own jobs, by id).
            alive = [p.native_id for p in g.pilots().values()
                     if p.native_id and p.native_id != BOGUS_NATIVE_ID]
            if alive:
                _run("scancel", *alive)


def pilot_dir(grid: SlurmGrid, reference: str) -> Path:
    return Path(grid.settings.agents.pilot_workdir).resolve() / reference


def assert_moves_forward(grid: SlurmGrid, reference: str) -> None:
    history = grid.seen[reference]
    order = [PILOT_STATES.index(s) for s in history]
    assert order == sorted(order), f"pilot {reference} went backwards: {history}"
    assert sum(s in FINAL_PILOT_STATES for s in history) <= 1, history


# -- the tests ----------------------------------------------------------------------------------

def test_the_director_sends_pilots_through_slurm_that_run_the_jobs(
        grid: SlurmGrid, slurm: str) -> None:
    jobs = grid.submit(3, seconds=2)
    assert all(grid.job(j)["status"] == "Waiting" for j in jobs)
    pool = RecordingPool(grid.context())
    director = Director(pool.ctx, pool)

    report = director.cycle()
    queue = f"{SITE}/{CE}/{QUEUE}"
    assert report.submitted == {queue: 3}, report.line()
    assert not report.failed and not report.skipped, report.line()
    pilots = grid.pilots()
    assert len(pilots) == 3
    for reference, p in pilots.items():
        assert (p.site, p.ce, p.queue, p.executor) == (SITE, CE, QUEUE, "slurm")
        assert p.status in ("Submitted", "Running"), (reference, p.status)
        # The native id is Slurm's id of the pilot's batch job.
        assert p.native_id is not None and p.native_id.isdigit(), p.native_id
        batch = scontrol_job(p.native_id)
        assert batch["JobId"] == p.native_id
        # (PSI/J 0.9's Slurm script names the job after its script file, not JobSpec.name:
        # the pilot's own work directory ties the Slurm job to the reference.)
        assert batch["WorkDir"] == str(pilot_dir(grid, reference))
        assert batch["Partition"] == slurm
        assert batch["TimeLimit"] == f"00:{WALL_MINUTES:02d}:00"

    done = {"Done", "Failed", "Killed"}
    deadline = time.monotonic() + 180
    while not all(grid.job(j)["status"] in done for j in jobs):
        pool.follow()
        grid.pilots()
        assert time.monotonic() < deadline, (
            [grid.job(j)["status"] for j in jobs],
            "\n".join(grid.pilot_log(r) for r in pilots))
        time.sleep(0.2)
    # The pilots say Done themselves before their batch jobs end: wait for Slurm's word too.
    final = grid.wait_pilots(
        lambda ps: all(p.status in FINAL_PILOT_STATES and p.log_state is not None
                       for p in ps.values()), "the pilots' batch jobs to end", pool=pool)

    native = {p.native_id: r for r, p in final.items()}
    ran_in = dict(line.split() for line in grid.record.read_text().splitlines())
    for job_id in jobs:
        job = grid.job(job_id)
        assert job["status"] == "Done" and job["exit_code"] == 0, job
        assert job["pilot_reference"] in final, job
        # The payload ran inside the Slurm job of the pilot that took it.
        assert native[ran_in[str(job_id)]] == job["pilot_reference"]
    for reference, p in final.items():
        assert p.status == "Done", (reference, p.status, p.reason, grid.pilot_log(reference))
        assert_moves_forward(grid, reference)
        assert grid.seen[reference][-2:] == ["Running", "Done"], grid.seen[reference]
        # Slurm's own view reached the record through PSI/J: queued, running, completed.
        states = pool.states_of(reference)
        assert states[0] == "QUEUED" and "COMPLETED" in states, states
        assert "ACTIVE" in states and states.index("ACTIVE") < states.index("COMPLETED")
        assert scontrol_job(str(p.native_id))["JobState"] == "COMPLETED"
        # Its output is kept, and its folder is gone.
        assert (p.log_state, p.exit_code) == ("stored", 0), (p.log_state, p.log_note)
        assert not pilot_dir(grid, reference).exists()
    # Work done, pilots gone: nothing more to submit.
    assert sum(director.cycle().submitted.values()) == 0


def test_pilot_records_follow_slurm_alone_running_done_failed_cancelled(
        grid: SlurmGrid) -> None:
    # Stand-in pilots that never call the matcher: only Slurm's states move their records.
    jobs = grid.submit(3)
    pool = RecordingPool(grid.context(**grid.fake_pilot()))
    report = Director(pool.ctx, pool).cycle()
    assert sum(report.submitted.values()) == 3, report.line()
    pilots = grid.pilots()
    ok, failing, cancelled = sorted(pilots)
    grid.set_exit_code(failing, 3)
    for p in pilots.values():
        assert p.status == "Submitted", (p.reference, p.status)
    grid.wait_pilots(lambda ps: all(p.status in ("Waiting", "Running") for p in ps.values()),
                     "Slurm to queue the pilots", pool=pool)
    for p in pilots.values():
        assert pool.states_of(p.reference)[0] == "QUEUED", pool.events

    running = grid.wait_pilots(lambda ps: ps[cancelled].status == "Running",
                               "Slurm to run the pilot to cancel", pool=pool)
    cancel = _run("scancel", str(running[cancelled].native_id))
    assert cancel.returncode == 0, cancel.stderr
    final = grid.wait_pilots(lambda ps: all(p.status in FINAL_PILOT_STATES for p in ps.values()),
                             "the pilots to end", pool=pool)

    assert final[ok].status == "Done", (final[ok].reason, grid.pilot_log(ok))
    assert final[failing].status == "Failed" and final[failing].reason, grid.pilot_log(failing)
    assert final[cancelled].status == "Aborted" and final[cancelled].reason
    assert pool.states_of(ok)[-1] == "COMPLETED"
    assert pool.states_of(failing)[-1] == "FAILED"
    assert pool.states_of(cancelled)[-1] == "CANCELED"
    for reference in pilots:
        assert_moves_forward(grid, reference)
        assert "Running" in grid.seen[reference], grid.seen[reference]
    assert scontrol_job(str(final[cancelled].native_id))["JobState"] == "CANCELLED"
    # Nobody pulled the jobs: they still wait, and the director sends new pilots for them.
    assert all(grid.job(j)["status"] == "Waiting" for j in jobs)
    more = Director(pool.ctx, pool).cycle()
    assert sum(more.submitted.values()) == 3, more.line()
    grid.wait_pilots(lambda ps: all(p.status in FINAL_PILOT_STATES for p in ps.values()),
                     "the second round of pilots to end", pool=pool)


def test_a_pilot_asks_slurm_for_the_queue_s_cores_memory_partition_and_wall_time(
        slurm: str, grid: SlurmGrid) -> None:
    Path(grid.settings.resources.file).write_text(
        resources_text(slurm, cores=2, memory_mb=1536), encoding="utf-8")
    grid.submit(1)
    pool = RecordingPool(grid.context(**grid.fake_pilot()))
    report = Director(pool.ctx, pool).cycle()
    assert sum(report.submitted.values()) == 1, report.line()
    ((reference, pilot),) = grid.pilots().items()
    assert pilot.native_id is not None
    job = scontrol_job(pilot.native_id)
    assert job["WorkDir"] == str(pilot_dir(grid, reference))
    assert job["Partition"] == slurm
    assert job["TimeLimit"] == f"00:{WALL_MINUTES:02d}:00"
    assert job["NumCPUs"] == "2"
    assert slurm_mb(job["MinMemoryNode"]) == 1536, (
        f"the pilot's batch job asks for {job['MinMemoryNode']} of memory, not the queue's "
        "MaxRAM of 1536 MB")
    grid.wait_pilots(lambda ps: all(p.status in FINAL_PILOT_STATES for p in ps.values()),
                     "the pilot to end", pool=pool)


#: Agent process 1: one director cycle, then exit (python -c FIRST_AGENT JSON).
FIRST_AGENT = """\
import json, sys
from dataclasses import replace
from agents.context import AgentContext
from agents.director import Director
from taskqueue.db.database import make_engine, make_session_factory
from taskqueue.core.settings import MatcherSettings, ResourcesSettings, Settings
a = json.loads(sys.argv[1])
base = Settings()
settings = replace(
    base, resources=ResourcesSettings(file=a["resources"]),
    matcher=MatcherSettings(url=a["matcher"]),
    agents=replace(base.agents, pilot_workdir=a["workdir"],
                   pilot_command=tuple(a["pilot_command"])))
engine = make_engine(a["database"])
ctx = AgentContext(settings, make_session_factory(engine), secret=a["secret"])
print(Director(ctx).cycle().line())
engine.dispose()
"""


def test_a_new_agent_process_reattaches_to_slurm_pilots_and_marks_unknown_ones_lost(
        grid: SlurmGrid) -> None:
    grid.submit(2)
    fake = grid.fake_pilot()
    first = _run(sys.executable, "-c", FIRST_AGENT,
                 json.dumps({"database": grid.db.url, "resources": grid.settings.resources.file,
                             "matcher": grid.base, "secret": SECRET,
                             "workdir": grid.settings.agents.pilot_workdir,
                             "pilot_command": list(fake["pilot_command"])}),
                 timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 pilot(s) submitted" in first.stdout, first.stdout + first.stderr
    submitted = grid.pilots()
    assert len(submitted) == 2 and all(p.native_id for p in submitted.values())

    # A pilot the records say runs in Slurm, under an id Slurm never gave out.
    ctx = grid.context(**fake)
    bogus = f"slurm-bogus-{uuid.uuid4().hex[:8]}"
    ctx.transaction(partial(record_new_pilots, vo="lhcb", site=SITE, ce=CE, queue=QUEUE,
                            executor="slurm", references=[bogus], now=ctx.now()))
    ctx.transaction(partial(record_submission, reference=bogus, native_id=BOGUS_NATIVE_ID,
                            now=ctx.now()))
    assert ctx.transaction(partial(set_pilot_status, reference=bogus, status="Running",
                                   now=ctx.now()))

    # Agent process 2: new compute elements, which never submitted anything, follow them.
    pool = RecordingPool(ctx)
    final = grid.wait_pilots(lambda ps: all(p.status in FINAL_PILOT_STATES
                                            and p.log_state is not None for p in ps.values()),
                             "the pilots to end", pool=pool)
    for reference in submitted:
        # Only the new pool watched them after the first process exited.
        assert final[reference].status == "Done", (final[reference].reason,
                                                   grid.pilot_log(reference))
        assert pool.states_of(reference)[-1] == "COMPLETED", pool.events
        assert "ACTIVE" in pool.states_of(reference), pool.events
        assert_moves_forward(grid, reference)
        assert "Running" in grid.seen[reference], grid.seen[reference]
    assert final[bogus].status == "Lost", (
        f"a pilot whose Slurm job id {BOGUS_NATIVE_ID} Slurm does not know became "
        f"{final[bogus].status} ({final[bogus].reason!r}), not Lost")
    assert "does not know it" in final[bogus].reason
    # Nothing is followed any more.
    ce = pool.get(CEConfig("psij", "slurm"))
    assert isinstance(ce, PsijCE) and not ce._jobs


class LaterStartPsijCE(RecordingPsijCE):
    """Its pilots ask Slurm to start them an hour from now (``--begin``): Slurm keeps them
    PENDING, which PSI/J reports as QUEUED."""

    def _get_executor(self) -> Any:
        executor = super()._get_executor()
        if not getattr(executor, "later_start", False):
            submit = executor.submit

            def later(job: Any) -> None:
                attributes = job.spec.attributes
                attributes.custom_attributes = {**(attributes.custom_attributes or {}),
                                                "slurm.begin": "now+3600"}
                submit(job)

            executor.submit, executor.later_start = later, True
        return executor


class LaterStartPool(RecordingPool):
    def get(self, config: CEConfig) -> ComputeElement:
        if config not in self._built and config.kind == "psij":
            self._built[config] = LaterStartPsijCE(config.executor, self.workdir, self.events)
        return super().get(config)


def test_a_pilot_slurm_keeps_queued_past_its_timeout_is_cancelled_and_counted(
        grid: SlurmGrid) -> None:
    grid.submit(1)
    pool = LaterStartPool(grid.context(pilot_queued_timeout=1, **grid.fake_pilot()))
    report = Director(pool.ctx, pool).cycle()
    assert sum(report.submitted.values()) == 1, report.line()
    (reference,) = grid.pilots()
    queued = grid.wait_pilots(lambda ps: ps[reference].ce_state == "QUEUED",
                              "Slurm to queue the pilot", pool=pool)
    native_id = str(queued[reference].native_id)
    assert scontrol_job(native_id)["JobState"] == "PENDING"

    killed = grid.wait_pilots(lambda ps: ps[reference].hung_in is not None,
                              "the pilot to be killed for waiting too long", pool=pool)
    pilot = killed[reference]
    assert (pilot.status, pilot.hung_in) == ("Aborted", "QUEUED"), pilot.reason
    assert re.fullmatch(r"stuck in QUEUED for \d+ s: killed", pilot.reason), pilot.reason
    # Killed through Slurm: the job is cancelled there, never started.
    grid.wait_pilots(lambda ps: pool.final_state(reference) == "CANCELED",
                     "PSI/J to see the cancelled job", pool=pool)
    assert scontrol_job(native_id)["JobState"] == "CANCELLED"
    assert "ACTIVE" not in pool.states_of(reference), pool.events
    with grid.db.factory() as session:
        assert pilots_stuck_since(session, pilot.submitted_at) == {
            (SITE, CE, QUEUE, "QUEUED"): 1}
