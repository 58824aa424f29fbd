"""The site director end to end, on every database backend.

- PSI/J's ``local`` executor starting real pilot processes that pull and run real jobs from a
  real matcher (gunicorn on loopback);
- the per-cycle, waiting and total caps (settings, and the resources file overriding them),
  with compute elements that start nothing;
- the back-off of a queue whose submissions fail, doubling per failure, reset by a success;
- two directors at once (threads with their own engines, and two ``gridpilot agents director
  --once`` processes) never submitting beyond the caps;
- PSI/J's real ``pbs`` and ``lsf`` executors against a fake batch system (tests/data/fakebatch.py:
  qsub/qstat/qdel and bsub/bjobs/bkill over a JSON state file): the rendered submit scripts, and
  the pilot records following the batch system's states (the pilot-status loop), a new agent
  process attaching to the pilots of an earlier one;
- what the director must not get wrong on a real site: batch jobs that ask for the queue's
  cores and memory and carry the pilot's name, pilots the batch system no longer knows marked
  Lost, pilots left Submitting by a director that died not blocking their queue forever, and
  the pilot token not readable by other users of the agents' host.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
import requests
from sqlalchemy import select, update

from agents.ce.base import (
    CA_FILE,
    TOKEN_FILE,
    CEError,
    CELoads,
    CEPilot,
    CERefused,
    CEState,
    CEUnavailable,
    PilotOutput,
    PilotSpec,
)
from agents.ce.config import CEConfig
from agents.ce.psij import PsijCE
from agents.ce.registry import ComputeElements
from agents.context import AgentContext
from agents.director import Director, compute_elements, targets
from agents.pilotstatus import PilotFollower
from agents.runner import Agents
from gridpilot.devserver import matcher_server
from optimizers.chain import Identity, submissions_from_text, submit
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine, make_session_factory
from taskqueue.db.models import DirectorQueue, Pilot
from taskqueue.pilots.records import FINAL_PILOT_STATES, record_new_pilots, record_submission
from taskqueue.pilots.records import set_pilot_status as _set_pilot_status
from taskqueue.queues.submitpools import get_submit_pools_for_queue
from taskqueue.tokens import issue_token
from tests.conftest import Database
from tests.data import fakebatch
from tests.helpers import claim

# PSI/J's local executor reads its processes' output pipes and never closes them
# (psij/executors/local.py, _ProcessEntry.poll); the ResourceWarning surfaces when its reaper
# thread drops the Popen object, in whichever test then runs.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <_io.FileIO name=[0-9]+ mode='rb' closefd=True>"
    ":pytest.PytestUnraisableExceptionWarning")

ROOT = Path(__file__).resolve().parents[2]
FAKEBATCH = ROOT / "tests" / "data" / "fakebatch.py"
SECRET = "director-integration-secret-0123456789"
USER = Identity(vo="lhcb", owner="alice", owner_group="lhcb_user")
DEMO = ("DIRAC.Demo.local", "localhost", "local")
#: A matcher URL for the tests whose pilots never run.
NOWHERE = "http://127.0.0.1:9"

#: A payload that leaves proof that it ran, and where.
PAYLOAD = """\
import os, sys
with open(os.path.join(sys.argv[1], os.environ["GRIDPILOT_JOB_ID"]), "w") as f:
    f.write(os.getcwd())
print("payload ran in", os.getcwd())
"""

CAPS_RESOURCES = """\
[JobDescription]
VO = "list"

[Sites."Test.Caps.org"]
VO = "lhcb"
HS06 = 10.0
MaxCPUTime = 1440

[Sites."Test.Caps.org".CEs."ce1.caps.org"]
Executor = "fake"

[Sites."Test.Caps.org".CEs."ce1.caps.org".Queues.single]
NumberOfProcessors = 1

[Sites."Test.Caps.org".CEs."ce1.caps.org".Queues.limited]
NumberOfProcessors = 1
MaxWaitingPilots = 3
MaxTotalPilots = 5

[Sites."Test.Caps.org".CEs."ce2.caps.org"]
# Inherited by the queue below, overriding agents.max_waiting_pilots.
Executor = "fake"
MaxWaitingPilots = 20

[Sites."Test.Caps.org".CEs."ce2.caps.org".Queues.quad]
NumberOfProcessors = 4

[Sites."Test.Caps.org".CEs."external.caps.org".Queues.ext]
# No Executor: pilots come from an external factory.
NumberOfProcessors = 1

[Sites."Test.Belle.org"]
VO = "belle"
HS06 = 10.0
MaxCPUTime = 1440
Executor = "fake"

[Sites."Test.Belle.org".CEs."ce.belle.org".Queues.q]
NumberOfProcessors = 1
"""

BATCH_SITE = """\
[JobDescription]
VO = "list"
Platform = "list"

[Sites."Test.Batch.org"]
VO = "lhcb"
HS06 = 10.0
Platform = "x86_64-el9"
"""

BATCH_CE = """
[Sites."Test.Batch.org".CEs."{ce}"]
Executor = "{executor}"
BatchQueue = "{batch_queue}"
Account = "{account}"
MaxCPUTime = {max_cpu}

[Sites."Test.Batch.org".CEs."{ce}".Queues.{queue}]
NumberOfProcessors = {cores}
{extra}
"""


# -- helpers -------------------------------------------------------------------------------------


class Clock:
    """The agents' clock, moved by the test."""

    def __init__(self, start: datetime) -> None:
        self.at = start

    def __call__(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> datetime:
        self.at += timedelta(seconds=seconds)
        return self.at


class FakeCEs(ComputeElements):
    """Compute elements that start nothing: each pilot's spec is recorded with its executor
    and answered a native id, or refused while ``failing`` is set (from the
    ``fail_after``-th submission on)."""

    def __init__(self, ctx: AgentContext, *, failing: str = "", fail_after: int = 0,
                 delay: float = 0.0, crash: type[BaseException] | None = None) -> None:
        super().__init__(Path(ctx.settings.agents.pilot_workdir), ctx.settings.agents)
        self.specs: list[tuple[str, PilotSpec]] = []
        self.attempts = 0
        self.failing, self.fail_after, self.delay, self.crash = (
            failing, fail_after, delay, crash)

    def get(self, config: CEConfig) -> FakeCE:
        return FakeCE(self, config.executor)


class FakeCE:
    def __init__(self, owner: FakeCEs, executor: str) -> None:
        self.owner, self.executor, self.name = owner, executor, f"fake:{executor}"

    def submit(self, specs: Sequence[PilotSpec]) -> list[str | CEError]:
        o = self.owner
        out: list[str | CEError] = []
        for spec in specs:
            if o.delay:
                time.sleep(o.delay)
            o.attempts += 1
            if o.crash is not None:
                raise o.crash()
            if o.failing and len(o.specs) >= o.fail_after:
                out.append(CERefused(o.failing))
                continue
            o.specs.append((self.executor, spec))
            out.append(f"native-{spec.reference}")
        return out

    def states(self, pilots: Sequence[CEPilot]) -> dict[str, CEState]:
        return {}

    def kill(self, pilots: Sequence[CEPilot]) -> dict[str, CEError | None]:
        return dict.fromkeys((p.reference for p in pilots), None)

    def outputs(self, pilots: Sequence[CEPilot], limit: int) -> dict[str, PilotOutput | CEError]:
        return {p.reference: PilotOutput(b"", b"") for p in pilots}

    def clean(self, pilots: Sequence[CEPilot]) -> None:
        pass

    def keep_credentials(self) -> None:
        pass

    def credential_warning(self) -> str:
        return ""

    def loads(self) -> CELoads | None:
        return None


class Killed(BaseException):
    """The agent process dies (SIGKILL, power cut) in the middle of a submission."""


def agent_settings(settings: Settings, tmp_path: Path, resources: Path, *,
                   matcher_url: str = NOWHERE, **agents: Any) -> Settings:
    return replace(
        settings, resources=replace(settings.resources, file=str(resources)),
        matcher=replace(settings.matcher, url=matcher_url),
        auth=replace(settings.auth, secret=SECRET),
        agents=replace(settings.agents, pilot_workdir=str(tmp_path / "pilots"), **agents))


def write_resources(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "resources.toml"
    path.write_text(text, encoding="utf-8")
    return path


def batch_ce(*, executor: str, ce: str, queue: str, batch_queue: str = "q",
             account: str = "a", max_cpu: int = 1440, cores: int = 1, extra: str = "") -> str:
    return BATCH_CE.format(executor=executor, ce=ce, queue=queue, batch_queue=batch_queue,
                           account=account, max_cpu=max_cpu, cores=cores, extra=extra)


def batch_resources(tmp_path: Path, *ces: str) -> Path:
    """Site Test.Batch.org with the CEs given (see batch_ce)."""
    return write_resources(tmp_path, BATCH_SITE + "".join(ces))


def submit_jobs(ctx: AgentContext, jdl: str) -> list[int]:
    """Jobs through the optimizer chain in this process, as the matcher does on submission."""
    result = ctx.transaction(lambda s: submit(s, submissions_from_text(jdl, "jdl"), USER,
                                              ctx.chain_context()))
    assert not result.failed, result.failed
    return list(result.waiting)


def echo_jobs(site: str, n: int, *, requirements: str = "") -> str:
    return (f'[ Executable = "/bin/echo"; Arguments = "hello"; CPUTime = 300; Site = "{site}"'
            + (f"; Requirements = [ {requirements} ]" if requirements else "")
            + (f"; Parameters = {n}" if n > 1 else "") + " ]")


def pilots(db: Database, queue: str | None = None) -> list[Pilot]:
    with db.factory() as session:
        stmt = select(Pilot).order_by(Pilot.id)
        if queue is not None:
            stmt = stmt.where(Pilot.queue == queue)
        return list(session.scalars(stmt))


def by_status(rows: list[Pilot]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in rows:
        out[row.status] = out.get(row.status, 0) + 1
    return out


def director_queue(db: Database, site: str, ce: str, queue: str) -> DirectorQueue:
    with db.factory() as session:
        row = session.get(DirectorQueue, (site, ce, queue))
        assert row is not None
        return row


def set_status(ctx: AgentContext, rows: list[Pilot], status: str) -> None:
    """Move the pilots to ``status``; a Running pilot has reached the matcher, as a real one
    does when it starts (until then the director counts it as waiting)."""
    for row in rows:
        assert ctx.transaction(lambda s, r=row: _set_pilot_status(
            s, reference=r.reference, status=status, now=ctx.now()))
        if status == "Running":
            ctx.transaction(lambda s, r=row: s.execute(
                update(Pilot).where(Pilot.id == r.id).values(last_seen_at=ctx.now())))


def wait_until(what: str, check: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.2)


def option(arguments: list[str], name: str) -> str:
    assert arguments.count(name) == 1, (name, arguments)
    return arguments[arguments.index(name) + 1]


def token_claims(token: str) -> dict[str, Any]:
    claims: dict[str, Any] = jwt.decode(token, SECRET, algorithms=["HS256"],
                                        options={"verify_iss": False})
    return claims


# -- 1. real pilots through PSI/J's local executor --------------------------------------------


def test_local_executor_starts_real_pilots_that_run_the_jobs(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    resources = tmp_path / "resources.toml"
    shutil.copyfile(ROOT / "conf" / "resources.toml", resources)
    script = tmp_path / "payload.py"
    script.write_text(PAYLOAD, encoding="utf-8")
    marks = tmp_path / "marks"
    marks.mkdir()
    site = DEMO[0]
    name = "/".join(DEMO)
    with matcher_server(db.url, SECRET, resources, tmp_path) as base:
        ctx = AgentContext(agent_settings(settings, tmp_path, resources, matcher_url=base,
                                          pilot_idle_timeout=3, pilots_per_cycle=3),
                           db.factory, secret=SECRET)
        assert [t.name for t in targets(ctx)] == [name]
        user = requests.Session()
        user.headers["Authorization"] = "Bearer " + issue_token(
            SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user", lifetime=3600)

        def post(jdl: str) -> list[int]:
            response = user.post(f"{base}/api/v1/jobs", data=jdl.encode(),
                                 headers={"Content-Type": "text/plain"}, timeout=30)
            assert response.status_code == 201, response.text
            ids: list[int] = response.json()["job_ids"]
            return ids

        def job(job_id: int) -> dict[str, Any]:
            response = user.get(f"{base}/api/v1/jobs/{job_id}", timeout=30)
            assert response.status_code == 200, response.text
            data: dict[str, Any] = response.json()
            return data

        echoes = post(echo_jobs(site, 3))
        # These carry an RFC 7 Requirements section: only a pilot given the queue's
        # SubmitPools (--submit-pools) can match them.
        scripted = post(f'[ Executable = "{sys.executable}"; Arguments = "{script} {marks}"; '
                        f'CPUTime = 300; Site = "{site}"; '
                        f'Requirements = [ Platform = "x86_64-el9"; MaxRAM = 1024 ]; '
                        f'Parameters = 2 ]')
        jobs = echoes + scripted
        assert all(job(j)["status"] == "Waiting" for j in jobs)

        director = Director(ctx)
        follower = PilotFollower(ctx, director.ces)
        report = director.cycle()
        # 5 one-core jobs want 5 pilots; pilots_per_cycle caps them at 3.
        assert report.submitted == {name: 3}, report.line()
        assert not report.failed and not report.skipped
        records = pilots(db)
        references = {p.reference for p in records}
        assert len(references) == 3
        assert all((p.site, p.ce, p.queue, p.executor) == (*DEMO, "local") for p in records)
        assert all(p.native_id for p in records)

        wait_until("every job is Done",
                   lambda: all(job(j)["status"] in ("Done", "Failed") for j in jobs), 120)
        done = {j: job(j) for j in jobs}
        assert all(d["status"] == "Done" for d in done.values()), done
        assert {d["pilot_reference"] for d in done.values()} <= references
        for job_id in scripted:
            assert (marks / str(job_id)).is_file(), "the scripted payload did not run"
        output = user.get(f"{base}/api/v1/jobs/{echoes[0]}/output", timeout=30).json()
        assert output["exit_code"] == 0 and "hello" in output["output_tail"]
        # Each pilot removed its token file once it had read it.
        assert not list((tmp_path / "pilots").rglob("pilot.token"))

        # Each pilot registers itself Running, then Done when it has had no job for 3 s.
        wait_until("every pilot says Done",
                   lambda: all(p.status in FINAL_PILOT_STATES for p in pilots(db)), 90)
        final = pilots(db)
        assert [p.status for p in final] == ["Done"] * 3, [(p.status, p.reason) for p in final]
        assert all(p.last_seen_at is not None for p in final), "a pilot never spoke"
        # PSI/J saw every pilot process end; the pilot-status loop keeps each pilot's output
        # and removes its folder.
        local = director.ces.get(CEConfig("psij", "local"))
        assert isinstance(local, PsijCE)
        wait_until("PSI/J reports every pilot process ended", lambda: not local.watched, 30)
        report = follower.turn()
        assert report.logs == 3 and not report.failed, report.line()
        final = pilots(db)
        assert [(p.log_state, p.exit_code) for p in final] == [("stored", 0)] * 3, [
            (p.log_state, p.log_note, p.exit_code) for p in final]
        assert not any((tmp_path / "pilots" / p.reference).exists() for p in final)
        log = requests.get(f"{base}/api/v1/pilots/{final[0].reference}/log", timeout=30,
                           headers={"Authorization": "Bearer " + issue_token(
                               SECRET, subject="olga", role="operator", vo="lhcb",
                               group="lhcb_admin", lifetime=600)})
        assert log.status_code == 200, log.text
        # The pilot logs to its standard error: what it matched and ran is there.
        assert final[0].reference in log.json()["stderr"]

        # Nothing is waiting any more: the next cycle submits nothing.
        again = Director(ctx).cycle()
        assert sum(again.submitted.values()) == 0, again.line()
        assert len(pilots(db)) == 3


# -- 2. caps -------------------------------------------------------------------------------------


def test_caps_per_cycle_waiting_and_total_from_settings_and_resources(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    resources = write_resources(tmp_path, CAPS_RESOURCES)
    ctx = AgentContext(agent_settings(settings, tmp_path, resources, pilots_per_cycle=4,
                                      max_waiting_pilots=5, max_total_pilots=8),
                       db.factory, secret=SECRET)
    found = {t.queue: (t.cores, t.max_waiting, t.max_total, t.executor) for t in targets(ctx)}
    # Not "ext" (no Executor), not the belle-only site.
    assert found == {"single": (1, 5, 8, "fake"), "limited": (1, 3, 5, "fake"),
                     "quad": (4, 20, 8, "fake")}
    submit_jobs(ctx, echo_jobs("Test.Caps.org", 21))
    pool = FakeCEs(ctx)
    director = Director(ctx, pool)
    single, limited, quad = (f"Test.Caps.org/{ce}/{q}" for ce, q in (
        ("ce1.caps.org", "single"), ("ce1.caps.org", "limited"), ("ce2.caps.org", "quad")))

    def cycle() -> dict[str, int]:
        report = director.cycle()
        assert not report.failed and not report.skipped, report.line()
        return {q: report.submitted.get(q, 0) for q in (single, limited, quad)}

    # single: min(21 needed, 4 per cycle, 5 waiting, 8 total) = 4
    # limited: min(21, 4, MaxWaitingPilots 3, MaxTotalPilots 5) = 3
    # quad: 21 one-core jobs on 4-core pilots need ceil(21/4) = 6: min(6, 4, 20, 8) = 4
    assert cycle() == {single: 4, limited: 3, quad: 4}
    # Right away, the pilots still waiting: single min(17, 4, 5-4, 8-4) = 1; limited is at
    # its waiting cap; quad: 6-4 = 2 still needed, and its CE allows 20 waiting.
    assert cycle() == {single: 1, limited: 0, quad: 2}
    assert cycle() == {single: 0, limited: 0, quad: 0}
    assert by_status(pilots(db)) == {"Submitted": 14}
    assert len(pool.specs) == 14

    # The pilots start: none waits, but the total caps hold (single 8 from the settings,
    # limited 5 from the resources file, quad 8).
    set_status(ctx, pilots(db), "Running")
    assert cycle() == {single: 3, limited: 2, quad: 2}
    assert cycle() == {single: 0, limited: 0, quad: 0}
    # Finished pilots free their place: single's 5 running pilots each run a job and end,
    # leaving 3 waiting: min(16 - 3 needed, 4, 5 - 3, 8 - 3) = 2.
    finished = [p for p in pilots(db, "single") if p.status == "Running"]
    for pilot in finished:
        claims = ctx.transaction(lambda s, p=pilot: claim(
            s, ctx.now(), site="Test.Caps.org", pilot_reference=p.reference))
        assert len(claims) == 1
    set_status(ctx, finished, "Done")
    assert cycle() == {single: 2, limited: 0, quad: 0}
    assert by_status(pilots(db, "single")) == {"Done": 5, "Submitted": 5}
    assert by_status(pilots(db, "limited")) == {"Running": 3, "Submitted": 2}
    assert by_status(pilots(db, "quad")) == {"Running": 6, "Submitted": 2}

    # What each pilot was given: its queue, its cores, its SubmitPools, and a token of its
    # own in the environment (never on the command line).
    records = {p.reference: p for p in pilots(db)}
    assert {spec.reference for _, spec in pool.specs} == set(records)
    for name, spec in pool.specs:
        record = records[spec.reference]
        assert name == "fake" and record.executor == "fake"
        assert record.native_id == f"native-{spec.reference}"
        args = spec.arguments
        assert option(args, "--reference") == spec.reference
        assert (option(args, "--site"), option(args, "--ce"), option(args, "--queue")) == (
            record.site, record.ce, record.queue)
        assert option(args, "--cores") == ("4" if record.queue == "quad" else "1")
        assert option(args, "--matcher") == NOWHERE
        assert option(args, "--submit-pools") == ""  # the jobs have no Requirements section
        # The token is handed over as a file the pilot removes once read: never in the
        # environment (payloads could read it in /proc/<pilot pid>/environ), never on the
        # command line.
        token = spec.token
        assert option(args, "--token-file") == TOKEN_FILE
        assert not any(token in a for a in args)
        assert not any(token in v for v in spec.environment.values())
        assert "GRIDPILOT_PILOT_TOKEN" not in spec.environment
        claims = token_claims(token)
        assert (claims["role"], claims["vo"], claims["site"], claims["pilot"]) == (
            "pilot", "lhcb", "Test.Caps.org", spec.reference)


# -- 3. back-off ---------------------------------------------------------------------------------


def test_failing_queue_backs_off_doubling_and_a_success_resets_it(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    resources = batch_resources(tmp_path, batch_ce(
        executor="fake", ce="ce.batch.org", queue="q"))
    key = ("Test.Batch.org", "ce.batch.org", "q")
    name = "/".join(key)
    clock = Clock(datetime(2030, 1, 1, 12, 0, tzinfo=UTC))
    ctx = AgentContext(agent_settings(settings, tmp_path, resources, failure_backoff=60),
                       db.factory, secret=SECRET, clock=clock)
    submit_jobs(ctx, echo_jobs("Test.Batch.org", 3))
    pool = FakeCEs(ctx, failing="batch system down")
    director = Director(ctx, pool)

    report = director.cycle()
    assert report.failed == {name: "batch system down (failure 1 in a row)"}
    assert report.submitted == {name: 0}
    # The pilots never reached the batch system: no record stays of them, the queue
    # counts them.
    assert pilots(db) == []
    state = director_queue(db, *key)
    assert state.failures == 1 and state.last_error == "batch system down"
    assert state.unsent_pilots == 3
    assert state.skip_until == clock.at + timedelta(seconds=60)

    backoff = 60
    for failure in range(2, 8):
        # Skipped while the back-off runs, and the report says why.
        clock.advance(backoff - 1)
        attempts = pool.attempts
        report = director.cycle()
        assert not report.submitted and not report.failed
        assert list(report.skipped) == [name]
        assert f"{failure - 1} failed submission(s)" in report.skipped[name]
        assert "batch system down" in report.skipped[name]
        assert pool.attempts == attempts and pilots(db) == []
        # Tried again once it is over; fails again; waits twice as long (at most 16 times).
        clock.advance(2)
        report = director.cycle()
        assert report.failed == {
            name: f"batch system down (failure {failure} in a row)"}
        backoff = 60 * min(16, 2 ** (failure - 1))
        state = director_queue(db, *key)
        assert state.failures == failure and state.unsent_pilots == 3 * failure
        assert state.skip_until == clock.at + timedelta(seconds=backoff)
    assert backoff == 960

    # The batch system is back: the queue gets its pilots, and its failure count starts over.
    pool.failing = ""
    clock.advance(backoff + 1)
    report = director.cycle()
    assert report.submitted == {name: 3} and not report.failed and not report.skipped
    state = director_queue(db, *key)
    # The count starts over; the last back-off's end stays, in the past (it is where the
    # director starts counting pilots that found no job).
    assert state.failures == 0
    assert state.skip_until is not None and state.skip_until <= clock()
    assert by_status(pilots(db)) == {"Submitted": 3}
    assert state.unsent_pilots == 21

    # A new failure backs off from the start again.
    set_status(ctx, [p for p in pilots(db) if p.status == "Submitted"], "Running")
    pool.failing = "batch system down again"
    report = director.cycle()
    assert report.failed == {
        name: "batch system down again (failure 1 in a row)"}, report.line()
    state = director_queue(db, *key)
    assert state.failures == 1 and state.skip_until == clock.at + timedelta(seconds=60)


def test_a_failure_mid_cycle_keeps_the_pilots_already_submitted(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    resources = batch_resources(tmp_path, batch_ce(
        executor="fake", ce="ce.batch.org", queue="q"))
    name = "Test.Batch.org/ce.batch.org/q"
    ctx = AgentContext(agent_settings(settings, tmp_path, resources), db.factory,
                       secret=SECRET)
    submit_jobs(ctx, echo_jobs("Test.Batch.org", 3))
    pool = FakeCEs(ctx, failing="quota exceeded", fail_after=1)
    report = Director(ctx, pool).cycle()
    assert report.submitted == {name: 1}
    assert report.failed == {name: "quota exceeded (failure 1 in a row)"}
    rows = pilots(db)
    assert [p.status for p in rows] == ["Submitted"]
    assert director_queue(db, "Test.Batch.org", "ce.batch.org", "q").unsent_pilots == 2
    submitted = rows[0]
    assert submitted.native_id == f"native-{submitted.reference}"



class _SilentCEs(FakeCEs):
    """Fake CEs, but executor "silent" answers nothing (CEUnavailable, as an ARC-CE past its
    deadline); ``silent_asked`` counts the submissions it was sent."""

    silent_asked = 0

    def get(self, config: CEConfig) -> Any:
        if config.executor != "silent":
            return super().get(config)
        owner = self

        class Silent(FakeCE):
            def submit(self, specs: Sequence[PilotSpec]) -> list[str | CEError]:
                owner.silent_asked += 1
                raise CEUnavailable("silent.batch.org: no complete answer within 30 s")

        return Silent(self, config.executor)


def test_a_ce_that_does_not_answer_is_waited_for_once_a_cycle(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    resources = batch_resources(
        tmp_path, batch_ce(executor="silent", ce="a.batch.org", queue="q"),
        batch_ce(executor="silent", ce="b.batch.org", queue="q"),
        batch_ce(executor="fake", ce="c.batch.org", queue="q"))
    ctx = AgentContext(agent_settings(settings, tmp_path, resources, failure_backoff=60),
                       db.factory, secret=SECRET)
    submit_jobs(ctx, echo_jobs("Test.Batch.org", 2))
    pool = _SilentCEs(ctx)
    report = Director(ctx, pool).cycle()
    # One of the silent CE's queues waited for it; the other was left alone this cycle, and
    # the healthy CE beside it got its pilots.
    assert pool.silent_asked == 1, report.line()
    assert len(report.failed) == 1 and len(report.skipped) == 1, report.line()
    assert "did not answer lately" in next(iter(report.skipped.values()))
    assert report.submitted.get("Test.Batch.org/c.batch.org/q", 0) > 0, report.line()

def test_every_pilot_gets_the_matchers_ca_as_a_file_and_its_argument(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    """[matcher] ca_bundle: each pilot's spec carries the file's bytes as CA_FILE, which its
    CE puts in the pilot's folder (as the token), and --ca-bundle CA_FILE; without the setting,
    neither. A CA file that cannot be read starts no pilot and says why."""
    resources = batch_resources(tmp_path, batch_ce(
        executor="fake", ce="ce.batch.org", queue="q"))
    ca = tmp_path / "matcher-ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    base = agent_settings(settings, tmp_path, resources, matcher_url="https://wms.example.org")
    with_ca = replace(base, matcher=replace(base.matcher, ca_bundle=str(ca)))
    ctx = AgentContext(with_ca, db.factory, secret=SECRET)
    submit_jobs(ctx, echo_jobs("Test.Batch.org", 2))
    pool = FakeCEs(ctx)
    report = Director(ctx, pool).cycle()
    assert sum(report.submitted.values()) == 2, report.line()
    for _, spec in pool.specs:
        assert spec.files[CA_FILE] == ca.read_bytes()
        assert option(spec.arguments, "--ca-bundle") == CA_FILE
        assert option(spec.arguments, "--matcher") == "https://wms.example.org"
    plain = FakeCEs(ctx)
    submit_jobs(ctx, echo_jobs("Test.Batch.org", 4))
    Director(AgentContext(base, db.factory, secret=SECRET), plain).cycle()
    assert plain.specs and all(CA_FILE not in spec.files and "--ca-bundle" not in spec.arguments
                               for _, spec in plain.specs)
    before = len(pilots(db))
    gone = replace(base, matcher=replace(base.matcher, ca_bundle=str(tmp_path / "gone.pem")))
    report = Director(AgentContext(gone, db.factory, secret=SECRET), FakeCEs(ctx)).cycle()
    assert list(report.failed) == ["matcher.ca_bundle"] and not report.submitted
    assert f"matcher.ca_bundle {tmp_path / 'gone.pem'} cannot be read" in report.line()
    assert len(pilots(db)) == before


def test_an_unknown_executor_fails_the_queue_with_the_reason(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    resources = batch_resources(tmp_path, batch_ce(
        executor="nosuch", ce="ce.batch.org", queue="q"))
    name = "Test.Batch.org/ce.batch.org/q"
    ctx = AgentContext(agent_settings(settings, tmp_path, resources, failure_backoff=300),
                       db.factory, secret=SECRET)
    submit_jobs(ctx, echo_jobs("Test.Batch.org", 2))
    director = Director(ctx)
    report = director.cycle()
    assert list(report.failed) == [name]
    assert "nosuch" in report.failed[name] and "failure 1 in a row" in report.failed[name]
    # No pilot left for any CE: no record of one stays; the queue keeps the reason.
    assert pilots(db) == []
    state = director_queue(db, "Test.Batch.org", "ce.batch.org", "q")
    assert "nosuch" in state.last_error and state.unsent_pilots == 2
    again = director.cycle()
    assert list(again.skipped) == [name] and "nosuch" in again.skipped[name]
    assert pilots(db) == []


def test_pilots_left_submitting_by_a_dead_director_do_not_block_the_queue_forever(
        db: Database, settings: Settings, tmp_path: Path, fake_batch: FakeBatch) -> None:
    """A director that dies between its decision (pilots recorded Submitting, committed) and
    the batch system's answer leaves records that no batch system knows and that nothing
    polls. Days later, long after their tokens expired, the agents must not count them as
    pilots waiting in the queue any more."""
    site, ce, queue = "Test.Batch.org", "pbs.batch.org", "grid"
    resources = batch_resources(tmp_path, batch_ce(executor="pbs", ce=ce, queue=queue))
    clock = Clock(datetime.now(UTC))
    ctx = AgentContext(agent_settings(settings, tmp_path, resources, max_waiting_pilots=3,
                                      pilot_status_interval=1),
                       db.factory, secret=SECRET, clock=clock)
    submit_jobs(ctx, echo_jobs(site, 3))
    with pytest.raises(Killed):
        Director(ctx, FakeCEs(ctx, crash=Killed)).cycle()
    assert [p.status for p in pilots(db)] == ["Submitting"] * 3
    assert not fake_batch.calls("qsub")

    # Three days later, a new agent process runs every loop, twice.
    clock.advance(ctx.settings.agents.pilot_token_lifetime + 86400)
    agents = Agents(ctx)
    fake_batch.pools.append(agents.ces)
    for _ in range(2):
        summaries = agents.run_once()
    stale = [p for p in pilots(db) if p.native_id is None]
    assert len(stale) == 3
    assert len(fake_batch.calls("qsub")) == 3, (
        f"director: {summaries['director']}; pilots: {by_status(pilots(db))}")


# -- 4. two directors at once -------------------------------------------------------------------


#: Directors racing each other in threads, each with its own engine (its own connections).
DIRECTORS = 4


def test_directors_in_threads_never_exceed_the_caps(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    resources = write_resources(tmp_path, CAPS_RESOURCES)
    base = agent_settings(settings, tmp_path, resources, pilots_per_cycle=3,
                          max_waiting_pilots=4, max_total_pilots=9)
    engines = [make_engine(db.url, pool_size=2) for _ in range(DIRECTORS)]
    try:
        contexts = [AgentContext(base, make_session_factory(e), secret=SECRET) for e in engines]
        submit_jobs(contexts[0], echo_jobs("Test.Caps.org", 12))
        pools = [FakeCEs(c, delay=0.02) for c in contexts]
        directors = [Director(c, p) for c, p in zip(contexts, pools, strict=True)]

        def race(cycles: int) -> None:
            barrier = threading.Barrier(DIRECTORS)
            errors: list[BaseException] = []

            def run(director: Director) -> None:
                try:
                    for _ in range(cycles):
                        barrier.wait(timeout=60)
                        report = director.cycle()
                        assert not report.failed, report.line()
                except BaseException as exc:  # re-raised in the test's thread
                    errors.append(exc)
                    barrier.abort()

            threads = [threading.Thread(target=run, args=(d,)) for d in directors]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert not any(t.is_alive() for t in threads)
            if errors:
                raise errors[0]

        def counts() -> dict[str, int]:
            return {q: len(pilots(db, q)) for q in ("single", "limited", "quad")}

        race(3)
        # The waiting caps: 4 (settings), 3 (MaxWaitingPilots), and quad needs ceil(12/4) = 3.
        assert counts() == {"single": 4, "limited": 3, "quad": 3}
        set_status(contexts[0], pilots(db), "Running")
        race(3)
        # Now the total caps: single 4 more waiting (8 of 9), limited 2 more (MaxTotalPilots
        # 5), quad 3 more.
        assert counts() == {"single": 8, "limited": 5, "quad": 6}
        specs = [s.reference for p in pools for _, s in p.specs]
        assert len(specs) == len(set(specs)) == len(pilots(db)) == 19
        assert all(p.status in ("Submitted", "Running") for p in pilots(db))
    finally:
        for e in engines:
            e.dispose()


# -- 5. the batch paths: PSI/J's pbs and lsf executors over a fake batch system ---------------


@dataclass
class FakeBatch:
    state_file: Path
    pools: list[ComputeElements] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        if not self.state_file.exists():
            return {"jobs": {}, "calls": []}
        data: dict[str, Any] = fakebatch.update(self.state_file, lambda s: s)
        return data

    def jobs(self) -> dict[str, dict[str, Any]]:
        jobs: dict[str, dict[str, Any]] = self.state()["jobs"]
        return jobs

    def calls(self, command: str) -> list[list[str]]:
        return [c[1:] for c in self.state()["calls"] if c[0] == command]

    def script(self, native_id: str) -> str:
        return Path(self.jobs()[native_id]["script"]).read_text(encoding="utf-8")

    def move(self, native_id: str, state: str, exit_code: int | None = None) -> None:
        def change(s: dict[str, Any]) -> None:
            job = s["jobs"][native_id]
            job["state"], job["exit"] = state, exit_code
        fakebatch.update(self.state_file, change)

    def finish(self, native_id: str, state: str, exit_code: int) -> None:
        """The job ends: its script wrote its exit code file (as the real script does at its
        end), and the batch system says so."""
        script = self.script(native_id)
        match = re.search(r'echo "\$\?" > "(.+)/\$(?:PBS|LSB)_JOBID\.ec"', script)
        assert match, script
        Path(match.group(1), f"{native_id}.ec").write_text(f"{exit_code}\n")
        self.move(native_id, state, exit_code)


@pytest.fixture()
def fake_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBatch]:
    """qsub, qstat, qdel, bsub, bjobs and bkill first on PATH, over a fresh state file."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for command in ("qsub", "qstat", "qdel", "bsub", "bjobs", "bkill"):
        path = bin_dir / command
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKEBATCH}" {command} "$@"\n')
        path.chmod(0o755)
    state = tmp_path / "batch" / "state.json"
    state.parent.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKEBATCH_STATE", str(state))
    batch = FakeBatch(state)
    yield batch
    # End every job, so that no PSI/J polling thread keeps asking about them after the test.
    for native_id, job in batch.jobs().items():
        if job["state"] not in ("F", "DONE", "EXIT"):
            batch.move(native_id, "F" if job["kind"] == "pbs" else "DONE", 0)
    deadline = time.monotonic() + 30
    while any(watched(p) for p in batch.pools) and time.monotonic() < deadline:
        time.sleep(0.2)


def watched(ces: ComputeElements) -> int:
    """Pilots whose end the PSI/J executors of ``ces`` have not seen yet."""
    return sum(ce.watched for ce in ces._built.values() if isinstance(ce, PsijCE))


def follow_until(follower: PilotFollower, what: str, check: Callable[[], bool],
                 timeout: float = 60) -> None:
    """Run the pilot-status loop until ``check`` holds."""
    def turn() -> bool:
        report = follower.turn()
        assert not report.failed, report.line()
        return check()
    wait_until(what, turn, timeout)


def launch_line(script: str) -> list[str]:
    lines = [line for line in script.splitlines() if "pilot" in line and "--matcher" in line]
    assert len(lines) == 1, script
    return shlex.split(lines[0])


def directives(script: str, prefix: str) -> list[str]:
    return [line[len(prefix):].strip() for line in script.splitlines()
            if line.startswith(prefix)]


def test_pbs_pilots_rendered_submitted_and_followed_through_their_states(
        db: Database, settings: Settings, tmp_path: Path, fake_batch: FakeBatch) -> None:
    site, ce, queue = "Test.Batch.org", "pbs.batch.org", "grid"
    resources = batch_resources(tmp_path, batch_ce(
        executor="pbs", ce=ce, queue=queue, batch_queue="gridq", account="lhcbprod",
        extra="WallTime = 90"))
    with matcher_server(db.url, SECRET, resources, tmp_path) as base:
        # PSI/J asks qstat every pilot_status_interval (at most 30 s): each state change
        # below would otherwise wait up to that long.
        ctx = AgentContext(agent_settings(settings, tmp_path, resources, matcher_url=base,
                                          pilot_idle_timeout=3, pilot_status_interval=1),
                           db.factory, secret=SECRET)
        jobs = submit_jobs(ctx, echo_jobs(site, 3, requirements='Platform = "x86_64-el9"'))
        pools = ctx.transaction(lambda s: get_submit_pools_for_queue(s, site, ce, queue))
        assert len(pools) == 1
        pool = compute_elements(ctx)
        fake_batch.pools.append(pool)
        follower = PilotFollower(ctx, pool)
        report = Director(ctx, pool).cycle()
        assert report.submitted == {f"{site}/{ce}/{queue}": 3}, report.line()
        assert len(fake_batch.calls("qsub")) == 3
        records = {p.native_id: p for p in pilots(db)}
        assert set(records) == set(fake_batch.jobs())

        for native_id, record in records.items():
            script = fake_batch.script(native_id)
            ref = record.reference
            pbs = directives(script, "#PBS")
            assert "-q gridq" in pbs and "-A lhcbprod" in pbs, pbs
            assert "-l walltime=1:30:0" in pbs, pbs
            args = launch_line(script)
            assert args[args.index(sys.executable) + 1:][:2] == ["-m", "pilot.cli"], args
            assert option(args, "--matcher") == base
            assert option(args, "--vo") == "lhcb"
            assert (option(args, "--site"), option(args, "--ce"), option(args, "--queue")) == (
                site, ce, queue)
            assert option(args, "--reference") == ref
            assert option(args, "--submit-pools") == pools[0]
            assert option(args, "--cores") == "1"
            # The token travels in a file of mode 0600, never in the script's environment
            # nor on its command line.
            assert "GRIDPILOT_PILOT_TOKEN" not in script
            assert option(args, "--token-file") == TOKEN_FILE
            token_file = tmp_path / "pilots" / ref / TOKEN_FILE
            assert token_file.stat().st_mode & 0o777 == 0o600
            token = token_file.read_text(encoding="ascii").strip()
            assert token not in script
            claims = token_claims(token)
            assert (claims["role"], claims["site"], claims["pilot"]) == ("pilot", site, ref)

        def status(native_id: str) -> str:
            return next(p.status for p in pilots(db) if p.native_id == native_id)

        # Queued in the batch system: Waiting; all pilots asked about in one qstat call.
        ids = sorted(records)
        follow_until(follower, "the pilots are Waiting",
                     lambda: all(status(n) == "Waiting" for n in ids))
        wait_until("qstat is asked about all pilots at once", lambda: any(
            set(ids) <= set(call) for call in fake_batch.calls("qstat")))
        first, second, third = ids

        # The first: running, then finished: Running, then Done, without ever speaking itself.
        fake_batch.move(first, "R")
        follow_until(follower, "the first pilot is Running", lambda: status(first) == "Running")
        fake_batch.finish(first, "F", 0)
        follow_until(follower, "the first pilot is Done", lambda: status(first) == "Done")
        # The second fails in the batch system.
        fake_batch.move(second, "R")
        follow_until(follower, "the second pilot is Running",
                     lambda: status(second) == "Running")
        fake_batch.finish(second, "F", 1)
        follow_until(follower, "the second pilot is Failed",
                     lambda: status(second) == "Failed")
        assert next(p.reason for p in pilots(db) if p.native_id == second)
        # The third really runs: the batch system runs its rendered script with bash; the
        # pilot pulls the three jobs from the matcher, runs them, and ends when idle.
        fake_batch.move(third, "R")
        follow_until(follower, "the third pilot is Running", lambda: status(third) == "Running")
        nodefile = tmp_path / "nodefile"
        nodefile.write_text("localhost\n")
        run = subprocess.run(["bash", fake_batch.jobs()[third]["script"]], cwd=tmp_path,
                             env={**os.environ, "PBS_JOBID": third,
                                  "PBS_NODEFILE": str(nodefile)},
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        fake_batch.move(third, "F", 0)  # the script wrote its exit code file itself
        follow_until(follower, "the third pilot is Done", lambda: status(third) == "Done")

        third_ref = records[third].reference
        for record in pilots(db):
            # Only the third pilot ever spoke to the matcher.
            assert (record.last_seen_at is not None) == (record.reference == third_ref)
        user_token = issue_token(SECRET, subject="alice", role="user", vo="lhcb",
                                 group="lhcb_user", lifetime=600)
        for job_id in jobs:
            data = requests.get(f"{base}/api/v1/jobs/{job_id}", timeout=30, headers={
                "Authorization": f"Bearer {user_token}"}).json()
            assert (data["status"], data["pilot_reference"]) == ("Done", third_ref), data


def test_lsf_pilots_submitted_by_an_agent_process_are_followed_by_another(
        db: Database, settings: Settings, tmp_path: Path, fake_batch: FakeBatch) -> None:
    site, ce, queue = "Test.Batch.org", "lsf.batch.org", "lhcb"
    # No WallTime: the pilot's wall time is the queue's MaxCPUTime, 150 minutes.
    resources = batch_resources(tmp_path, batch_ce(
        executor="lsf", ce=ce, queue=queue, batch_queue="long", account="lhcbsgm", max_cpu=150))
    ctx = AgentContext(agent_settings(settings, tmp_path, resources), db.factory,
                       secret=SECRET)
    submit_jobs(ctx, echo_jobs(site, 2))
    env = {**os.environ, "GRIDPILOT_DATABASE_URL": db.url, "GRIDPILOT_AUTH_SECRET": SECRET,
           "GRIDPILOT_RESOURCES_FILE": str(resources), "GRIDPILOT_MATCHER_URL": NOWHERE,
           "GRIDPILOT_AGENTS_PILOT_WORKDIR": str(tmp_path / "pilots")}
    run = subprocess.run([sys.executable, "-m", "gridpilot", "agents", "director", "--once"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"director: 2 pilot(s) submitted; 2 to {site}/{ce}/{queue}" in run.stdout, run.stdout
    assert len(fake_batch.calls("bsub")) == 2
    records = {p.native_id: p for p in pilots(db)}
    assert set(records) == set(fake_batch.jobs())
    for native_id, record in records.items():
        # Its batch system took it; what becomes of it is the pilot-status loop's to see.
        assert record.status == "Submitted" and record.executor == "lsf"
        script = fake_batch.script(native_id)
        bsub = directives(script, "#BSUB")
        assert '-q "long"' in bsub and '-P "lhcbsgm"' in bsub and "-W 2:30" in bsub, bsub
        assert f'-cwd "{tmp_path / "pilots" / record.reference}"' in bsub, bsub
        args = launch_line(script)
        assert (option(args, "--site"), option(args, "--ce"), option(args, "--queue")) == (
            site, ce, queue)
        assert option(args, "--reference") == record.reference
        assert option(args, "--matcher") == NOWHERE
        assert "--submit-pools" in args
        assert "GRIDPILOT_PILOT_TOKEN" not in script
        assert option(args, "--token-file") == TOKEN_FILE
        token_file = tmp_path / "pilots" / record.reference / TOKEN_FILE
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text(encoding="ascii").strip()
        assert token_claims(token)["pilot"] == record.reference
        assert token not in script

    # Another agent process (this one) attaches to the pilots by their native ids and
    # follows them.
    pool = compute_elements(replace(ctx, settings=replace(ctx.settings, agents=replace(
        ctx.settings.agents, pilot_status_interval=1))))
    fake_batch.pools.append(pool)
    follower = PilotFollower(ctx, pool)
    follower.turn()
    lsf = pool.get(CEConfig("psij", "lsf"))
    assert isinstance(lsf, PsijCE) and lsf.watched == 2
    follower.turn()
    assert lsf.watched == 2  # already watched

    def status(native_id: str) -> str:
        return next(p.status for p in pilots(db) if p.native_id == native_id)

    ok, bad = sorted(records)
    for native_id in (ok, bad):
        fake_batch.move(native_id, "RUN")
    follow_until(follower, "both pilots are Running",
                 lambda: status(ok) == "Running" and status(bad) == "Running")
    wait_until("bjobs is asked about both pilots at once", lambda: any(
        {ok, bad} <= set(call) for call in fake_batch.calls("bjobs")))
    fake_batch.finish(ok, "DONE", 0)
    fake_batch.finish(bad, "EXIT", 3)
    follow_until(follower, "both pilots ended",
                 lambda: status(ok) == "Done" and status(bad) == "Failed")
    assert next(p.reason for p in pilots(db) if p.native_id == bad)
    # Both ended: their folders are gone, their logs kept, and nothing is followed any more.
    assert {p.log_state for p in pilots(db)} == {"stored"}
    assert lsf.watched == 0 and not lsf._jobs


@pytest.mark.parametrize("executor", ["pbs", "lsf"])
def test_batch_pilot_scripts_name_the_pilot_and_ask_for_its_cores_and_memory(
        db: Database, settings: Settings, tmp_path: Path, fake_batch: FakeBatch,
        executor: str) -> None:
    """A 4-core, 8 GB queue. The pilot fills 4 cores and 8192 MB (its --cores and --memory), so
    its batch job must ask for them, or the batch system gives it one core and its default
    memory; and the job carries the pilot's name, for the site's admins to recognise."""
    site, ce, queue = "Test.Batch.org", f"{executor}.batch.org", "mcore"
    resources = batch_resources(tmp_path, batch_ce(executor=executor, ce=ce, queue=queue,
                                                   cores=4, extra="MaxRAM = 8192"))
    ctx = AgentContext(agent_settings(settings, tmp_path, resources), db.factory,
                       secret=SECRET)
    submit_jobs(ctx, echo_jobs(site, 4))
    pool = compute_elements(ctx)
    fake_batch.pools.append(pool)
    report = Director(ctx, pool).cycle()
    # Four one-core jobs fill one 4-core pilot.
    assert report.submitted == {f"{site}/{ce}/{queue}": 1}, report.line()
    (record,) = pilots(db)
    script = fake_batch.script(record.native_id or "")
    args = launch_line(script)
    assert option(args, "--cores") == "4" and option(args, "--memory") == "8192"
    name = re.escape(f"gridpilot-{record.reference}")
    if executor == "pbs":
        found = directives(script, "#PBS")
        named = [d for d in found if re.fullmatch(rf'-N[= ]"?{name}"?', d)]
        cores = [d for d in found if re.search(r"\bncpus=4\b", d)]
        memory = [m for d in found for m in re.findall(r"\bmem=(\d+)([kmgt]?b)?\b", d, re.I)]
    else:
        found = directives(script, "#BSUB")
        named = [d for d in found if re.fullmatch(rf'-J "?{name}"?', d)]
        cores = [d for d in found if d == "-n 4"]
        memory = [m for d in found for m in re.findall(r"^-M (\d+)([KMGT]?B)?$", d)]
    problems = []
    if not named:
        problems.append(f"the job is not named gridpilot-{record.reference}")
    if not cores:
        problems.append("the job does not ask for 4 cores")
    if [_megabytes(*m) for m in memory] != [8192]:
        problems.append(f"the job does not ask for 8192 MB (asks for {memory})")
    assert not problems, f"{problems}; the script's directives: {found}"


def _megabytes(number: str, unit: str) -> float:
    scale = {"": 1 / 1024 ** 2, "b": 1 / 1024 ** 2, "kb": 1 / 1024, "mb": 1, "gb": 1024,
             "tb": 1024 ** 2}[unit.lower()]
    return int(number) * scale


def test_the_token_in_a_queued_pilot_script_is_readable_by_the_agents_user_only(
        db: Database, settings: Settings, tmp_path: Path, fake_batch: FakeBatch) -> None:
    """PSI/J keeps each batch pilot's submit script, token and all, in the agents' work folder
    until the pilot ends. With the usual umask (022) that must not make the token, a bearer
    credential valid for two days, readable by every user of the agents' host."""
    site, ce, queue = "Test.Batch.org", "pbs.batch.org", "grid"
    resources = batch_resources(tmp_path, batch_ce(executor="pbs", ce=ce, queue=queue))
    ctx = AgentContext(agent_settings(settings, tmp_path, resources), db.factory,
                       secret=SECRET)
    submit_jobs(ctx, echo_jobs(site, 1))
    pool = compute_elements(ctx)
    fake_batch.pools.append(pool)
    previous = os.umask(0o022)
    try:
        report = Director(ctx, pool).cycle()
    finally:
        os.umask(previous)
    assert report.submitted == {f"{site}/{ce}/{queue}": 1}, report.line()
    root = tmp_path / "pilots"
    (token_file,) = root.rglob("pilot.token")
    token = token_file.read_text(encoding="ascii").strip()
    scripts = [p for p in root.rglob("*") if p.is_file() and token in
               p.read_text(encoding="utf-8", errors="replace")]
    # Only the token file holds it: PSI/J's copy of the submit script does not.
    assert scripts == [token_file]
    for script in scripts:
        # Others can read it if the file is readable to them and every folder from the work
        # folder down to it lets them through.
        chain = [script, *[d for d in script.parents if d == root or root in d.parents]]
        exposed = (chain[0].stat().st_mode & 0o044 != 0
                   and all(d.stat().st_mode & 0o011 != 0 for d in chain[1:]))
        modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in chain}
        assert not exposed, f"the pilot token is readable by other users: {modes}"


@pytest.mark.parametrize("executor", ["local", "pbs", "lsf"])
def test_a_pilot_the_batch_system_no_longer_knows_is_lost(
        db: Database, settings: Settings, tmp_path: Path, fake_batch: FakeBatch,
        executor: str) -> None:
    """An agent process attaching to the pilots of an earlier one marks Lost a pilot its batch
    system no longer knows (a process long gone; a batch job purged without ever running)."""
    resources = batch_resources(tmp_path, batch_ce(
        executor=executor, ce="ce.batch.org", queue="q"))
    ctx = AgentContext(agent_settings(settings, tmp_path, resources), db.factory,
                       secret=SECRET)
    if executor == "local":
        gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True)
        native_id = gone.stdout.strip()
    else:
        native_id = "999.fakepbs" if executor == "pbs" else "999"
    now = datetime.now(UTC)
    ctx.transaction(lambda s: record_new_pilots(s, "lhcb", "Test.Batch.org", "ce.batch.org",
                                                "q", executor, ["vanished"], now=now))
    ctx.transaction(lambda s: record_submission(s, "vanished", native_id, now=now))
    pool = compute_elements(ctx)
    fake_batch.pools.append(pool)
    follow_until(PilotFollower(ctx, pool), "the pilot's record is final",
                 lambda: pilots(db)[0].status in FINAL_PILOT_STATES, 30)
    (record,) = pilots(db)
    assert record.status == "Lost", (record.status, record.reason)
    assert "does not know it" in record.reason
    # Nothing of it to keep: it is no longer followed.
    assert record.log_state == "unavailable", record.log_note


def test_two_director_processes_at_once_never_exceed_the_caps(
        db: Database, settings: Settings, tmp_path: Path, fake_batch: FakeBatch) -> None:
    site, ce, queue = "Test.Batch.org", "pbs.batch.org", "grid"
    resources = batch_resources(tmp_path, batch_ce(
        executor="pbs", ce=ce, queue=queue, extra="MaxWaitingPilots = 3"))
    ctx = AgentContext(agent_settings(settings, tmp_path, resources), db.factory,
                       secret=SECRET)
    submit_jobs(ctx, echo_jobs(site, 8))
    env = {**os.environ, "GRIDPILOT_DATABASE_URL": db.url, "GRIDPILOT_AUTH_SECRET": SECRET,
           "GRIDPILOT_RESOURCES_FILE": str(resources), "GRIDPILOT_MATCHER_URL": NOWHERE,
           "GRIDPILOT_AGENTS_PILOT_WORKDIR": str(tmp_path / "pilots")}
    submitted = 0
    for _ in range(2):
        procs = [subprocess.Popen([sys.executable, "-m", "gridpilot", "agents", "director",
                                   "--once"], cwd=tmp_path, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for _ in range(2)]
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, out
            line = next(x for x in out.splitlines() if x.startswith("director: "))
            match = re.match(r"director: (\d+) pilot\(s\) submitted", line)
            assert match or "running in another agent process" in line, line
            submitted += int(match.group(1)) if match else 0
        # MaxWaitingPilots = 3 for the queue, whatever the number of directors.
        rows = pilots(db)
        assert len(rows) == 3, by_status(rows)
    assert submitted == 3
    assert len(fake_batch.calls("qsub")) == 3
    assert all(p.native_id in fake_batch.jobs() for p in pilots(db))
