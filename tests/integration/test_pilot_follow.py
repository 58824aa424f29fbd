"""The pilot-status loop (agents.pilotstatus) on every backend: a kill passed through a real
PSI/J local executor to a running pilot process, the log of a pilot that failed with its own
reason, a CE that does not answer (backed off, its queues showing it, its pilots' records
kept), a pilot whose CE left the configuration, and pilots whose CE never confirms their
end."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from agents.ce.base import CEError, CELoads, CEPilot, CEState, CEUnavailable, PilotOutput, PilotSpec
from agents.ce.config import CEConfig
from agents.ce.registry import ComputeElements
from agents.context import AgentContext
from agents.director import Director, compute_elements
from agents.pilotstatus import PilotFollower
from taskqueue.core.settings import Settings
from taskqueue.db.models import DirectorQueue, Pilot
from taskqueue.pilots.pilotlogs import pilots_to_follow, request_kill
from taskqueue.pilots.records import PilotInfo, record_new_pilots, record_submission, register_pilot
from tests.conftest import Database
from tests.integration.test_director import (
    SECRET,
    agent_settings,
    batch_ce,
    batch_resources,
    echo_jobs,
    pilots,
    submit_jobs,
    wait_until,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <_io.FileIO name=[0-9]+ mode='rb' closefd=True>"
    ":pytest.PytestUnraisableExceptionWarning")

SITE, CE, QUEUE = "Test.Batch.org", "ce.batch.org", "q"
NAME = f"{SITE}/{CE}/{QUEUE}"

#: A stand-in pilot that speaks to nobody: it says it started, then waits to be killed (or
#: exits with the code and last words given in its folder's "end" file).
STAND_IN = """\
echo "stand-in pilot $$ started"
echo "a line on stderr" >&2
for _ in $(seq 600); do
  if [ -f end ]; then read code words < end; echo "$words" >&2; exit "$code"; fi
  sleep 0.1
done
"""


#: A stand-in pilot that only waits to be killed, with no child process: PSI/J's local
#: executor kills a process's children first, and one that exits in between (a `sleep` of the
#: loop above) makes its reaper thread raise and retry.
SLEEPER = 'echo "stand-in pilot $$ started"; exec sleep 600'


def local_context(db: Database, settings: Settings, tmp_path: Path, *,
                  stand_in: str = STAND_IN, **agents: Any) -> AgentContext:
    resources = batch_resources(tmp_path, batch_ce(executor="local", ce=CE, queue=QUEUE))
    return AgentContext(agent_settings(settings, tmp_path, resources, pilot_status_interval=1,
                                       pilot_command=("/bin/sh", "-c", stand_in), **agents),
                        db.factory, secret=SECRET)


def follow_until(follower: PilotFollower, what: str, check: Callable[[], bool]) -> None:
    def turn() -> bool:
        report = follower.turn()
        assert not report.failed, report.line()
        return check()
    wait_until(what, turn, 60)


def the_pilot(db: Database) -> Pilot:
    (pilot,) = pilots(db)
    return pilot


def test_an_operator_s_kill_reaches_the_running_pilot_through_its_ce(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    ctx = local_context(db, settings, tmp_path, stand_in=SLEEPER)
    submit_jobs(ctx, echo_jobs(SITE, 1))
    ces = compute_elements(ctx)
    follower = PilotFollower(ctx, ces)
    assert Director(ctx, ces).cycle().submitted == {f"{SITE}/{CE}/{QUEUE}": 1}
    follow_until(follower, "the pilot runs", lambda: the_pilot(db).status == "Running")
    pid = int(the_pilot(db).native_id or 0)
    os.kill(pid, 0)  # alive

    ctx.transaction(partial(request_kill, vo="lhcb", reference=the_pilot(db).reference,
                            by="olga", now=ctx.now()))
    report = follower.turn()
    assert report.killed == 1, report.line()
    killed = the_pilot(db)
    assert killed.status == "Aborted"
    assert killed.reason == "killed through its CE at the request of olga"
    # The CE confirms the end: the log is kept, the folder removed, the process gone.
    follow_until(follower, "the pilot's log is kept",
                 lambda: the_pilot(db).log_state == "stored")
    wait_until("the pilot process is gone", lambda: not _alive(pid), 10)
    assert not (tmp_path / "pilots" / killed.reference).exists()
    assert ctx.transaction(pilots_to_follow) == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by PSI/J's thread) is as good as gone.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:  # reaped in between
        return False


def test_a_pilot_that_fails_says_why_in_its_own_words(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    ctx = local_context(db, settings, tmp_path)
    submit_jobs(ctx, echo_jobs(SITE, 1))
    ces = compute_elements(ctx)
    follower = PilotFollower(ctx, ces)
    Director(ctx, ces).cycle()
    reference = the_pilot(db).reference
    # Written whole, then renamed: the stand-in never reads half of it.
    end = tmp_path / "pilots" / reference / "end.new"
    end.write_text("5 gridpilot-pilot: exit 5: the matcher at http://127.0.0.1:9 was never "
                   "reached\n")
    end.rename(end.with_name("end"))
    follow_until(follower, "the pilot's end is seen",
                 lambda: the_pilot(db).log_state is not None)
    pilot = the_pilot(db)
    assert (pilot.status, pilot.exit_code, pilot.log_state) == ("Failed", 5, "stored")
    assert pilot.reason == ("exit code 5: gridpilot-pilot: exit 5: the matcher at "
                            "http://127.0.0.1:9 was never reached")


class SilentCE:
    """A CE that does not answer (until told to), then says its pilots run; ``asked`` counts
    the requests it was sent."""

    name = "silent"

    def __init__(self) -> None:
        self.down = True
        self.asked = 0

    def submit(self, specs: Sequence[PilotSpec]) -> list[str | CEError]:
        return [f"native-{s.reference}" for s in specs]

    def states(self, pilots: Sequence[CEPilot]) -> dict[str, CEState]:
        self.asked += 1
        if self.down:
            raise CEUnavailable("silent.example.org:443: connection refused")
        return {p.reference: CEState("Running") for p in pilots}

    def kill(self, pilots: Sequence[CEPilot]) -> dict[str, CEError | None]:
        self.asked += 1
        if self.down:
            raise CEUnavailable("silent.example.org:443: connection refused")
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


def test_a_ce_that_does_not_answer_is_left_alone_a_while_and_its_pilots_kept(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    ctx = local_context(db, settings, tmp_path, failure_backoff=60)
    now = [1000.0]
    ce = SilentCE()

    class Silent(ComputeElements):
        def get(self, config: CEConfig) -> Any:
            return ce

    ces = Silent(tmp_path / "pilots", ctx.settings.agents, clock=lambda: now[0])
    follower = PilotFollower(ctx, ces)
    when = datetime.now(UTC)
    ctx.transaction(partial(record_new_pilots, vo="lhcb", site=SITE, ce=CE, queue=QUEUE,
                            executor="local", references=["p1", "p2"], now=when))
    for ref in ("p1", "p2"):
        ctx.transaction(partial(record_submission, reference=ref, native_id=f"n-{ref}",
                                now=when))
    ctx.transaction(partial(request_kill, vo="lhcb", reference="p1", by="olga", now=when))

    report = follower.turn()
    assert list(report.failed.values()) == [
        "silent.example.org:443: connection refused (failure 1 in a row)"]
    # Nothing changed in the records: no kill recorded, no state invented.
    assert [(p.status, p.kill_requested_by) for p in pilots(db)] == [
        ("Submitted", "olga"), ("Submitted", None)]
    # Its queue shows the failed poll on the sites page, apart from failed submissions (issue
    # 34 item 2), and the director skips it meanwhile, saying what failed.
    with db.factory() as session:
        state = session.get(DirectorQueue, (SITE, CE, QUEUE))
        assert state is not None and (state.poll_failures, state.failures) == (1, 0)
        assert "connection refused" in state.poll_error and state.last_error == ""
    director = Director(ctx, ces)
    skipped = director.cycle().skipped[NAME]
    assert "1 failed poll(s) of its CE in a row" in skipped and "submission" not in skipped
    # Left alone while its back-off runs (60 s), asked again once it is over; after a
    # second failure it is left alone twice as long.
    asked = ce.asked
    assert not follower.turn().failed and ce.asked == asked
    now[0] += 61
    assert "failure 2 in a row" in next(iter(follower.turn().failed.values()))
    assert ce.asked == asked + 1
    now[0] += 61
    assert not follower.turn().failed and ce.asked == asked + 1
    now[0] += 60
    # Back: what it says is recorded, and the kill goes through once it answers.
    ce.down = False
    report = follower.turn()
    assert not report.failed and report.killed == 1, report.line()
    assert [p.status for p in pilots(db)] == ["Aborted", "Running"]
    # The successful poll ended the poll back-off: the director serves the queue again now,
    # not when the back-off of the second failure (120 s) would have ended.
    with db.factory() as session:
        state = session.get(DirectorQueue, (SITE, CE, QUEUE))
        assert state is not None
        assert (state.poll_failures, state.poll_skip_until, state.poll_error) == (0, None, "")
    report = director.cycle()
    assert NAME not in report.skipped and not report.failed, report.line()


def test_a_pilot_whose_ce_left_the_configuration_is_lost_and_no_longer_followed(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    ctx = local_context(db, settings, tmp_path)
    when = datetime.now(UTC)
    ctx.transaction(partial(record_new_pilots, vo="lhcb", site=SITE, ce="gone.example.org",
                            queue="grid", executor="arc", references=["arc-1"], now=when))
    ctx.transaction(partial(record_submission, reference="arc-1", native_id="abc",
                            now=when))
    report = PilotFollower(ctx, compute_elements(ctx)).turn()
    assert report.unavailable == 1
    pilot = the_pilot(db)
    assert pilot.status == "Lost" and "no longer in the resources configuration" in pilot.reason
    assert pilot.log_state == "unavailable"


def test_a_pilot_that_said_it_ended_is_let_go_when_its_ce_never_confirms(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    ctx = local_context(db, settings, tmp_path, pilot_log_patience=3600)
    then = datetime.now(UTC) - timedelta(hours=2)
    ctx.transaction(partial(record_new_pilots, vo="lhcb", site=SITE, ce=CE, queue=QUEUE,
                            executor="local", references=["old", "new"], now=then))
    for ref in ("old", "new"):
        ctx.transaction(partial(record_submission, reference=ref, native_id=str(10**7 + 1),
                                now=then))
    ctx.transaction(lambda s: register_pilot(s, "lhcb", PilotInfo("old", SITE, CE, QUEUE,
                                                                  "Done"), now=then))
    ctx.transaction(lambda s: register_pilot(s, "lhcb", PilotInfo(
        "new", SITE, CE, QUEUE, "Done"), now=datetime.now(UTC)))

    class Quiet(ComputeElements):
        def get(self, config: CEConfig) -> Any:
            return _Quiet()

    report = PilotFollower(ctx, Quiet(tmp_path, ctx.settings.agents)).turn()
    assert report.unavailable == 1
    with db.factory() as session:
        states = dict(session.execute(select(Pilot.reference, Pilot.log_state)).all())
    assert states == {"old": "unavailable", "new": None}


class _Quiet(SilentCE):
    def states(self, pilots: Sequence[CEPilot]) -> dict[str, CEState]:
        return {}


def test_pilot_logs_leave_with_the_sandboxes_after_the_retention_period(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    from agents.sandboxcleanup import clean_up_sandboxes
    from taskqueue.files.sandboxstore import LocalStore
    from taskqueue.pilots.pilotlogs import pack_log, record_log

    store = LocalStore(tmp_path / "store")
    then = datetime.now(UTC) - timedelta(days=30)
    ctx = local_context(db, settings, tmp_path)
    for ref, when in (("old", then), ("new", datetime.now(UTC))):
        ctx.transaction(partial(record_new_pilots, vo="lhcb", site=SITE, ce=CE, queue=QUEUE,
                                executor="local", references=[ref], now=when))
        ctx.transaction(partial(record_submission, reference=ref, native_id=ref, now=when))
        log_id, packed = pack_log(f"{ref} out".encode(), b"")
        store.put(log_id, packed)
        ctx.transaction(partial(record_log, vo="lhcb", reference=ref, log_id=log_id,
                                size=len(packed), note="", now=when))
    summary = clean_up_sandboxes(ctx, store)
    assert summary.startswith("1 sandbox(es) removed"), summary
    with db.factory() as session:
        logs = dict(session.execute(select(Pilot.reference, Pilot.log_id)).all())
    assert store.size(logs["old"] or "") is None
    assert store.size(logs["new"] or "") is not None


class _Odd(SilentCE):
    """A CE whose answer the client did not foresee (a ValueError out of it), then one whose
    failure reason holds a NUL, which PostgreSQL refuses in text."""

    def states(self, pilots: Sequence[CEPilot]) -> dict[str, CEState]:
        self.asked += 1
        if self.down:
            raise ValueError("invalid literal for int() with base 10: 'abc'")
        return {p.reference: CEState("Failed", "LRMS error\x00: exit 1") for p in pilots}


def test_a_ces_malformed_answer_is_that_ces_failure_only(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    ctx = local_context(db, settings, tmp_path, failure_backoff=60)
    now = [1000.0]
    ce = _Odd()

    class Odd(ComputeElements):
        def get(self, config: CEConfig) -> Any:
            return ce

    follower = PilotFollower(ctx, Odd(tmp_path / "pilots", ctx.settings.agents,
                                      clock=lambda: now[0]))
    when = datetime.now(UTC)
    ctx.transaction(partial(record_new_pilots, vo="lhcb", site=SITE, ce=CE, queue=QUEUE,
                            executor="local", references=["p1"], now=when))
    ctx.transaction(partial(record_submission, reference="p1", native_id="n-p1", now=when))
    report = follower.turn()
    assert list(report.failed.values()) == [
        "invalid literal for int() with base 10: 'abc' (failure 1 in a row)"]
    now[0] += 61
    ce.down = False
    assert not follower.turn().failed
    assert [(p.status, p.reason) for p in pilots(db)] == [("Failed", "LRMS error: exit 1")]
