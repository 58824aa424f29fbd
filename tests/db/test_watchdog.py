"""The stalled-job watchdog on every database: silent jobs become Stalled, then are rescheduled
(or failed at the maximum); never-started Matched jobs go back to their queue uncounted; jobs of
dead pilots are rescheduled at once; a job that speaks again is left alone; two watchdogs at once
reschedule each job exactly once."""

from __future__ import annotations

import multiprocessing
import shutil
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, update

from agents.context import AgentContext
from agents.watchdog import watch_jobs
from taskqueue.core.settings import ResourcesSettings, Settings
from taskqueue.core.states import NO_DIRECTOR_MINOR_STATUS, JobStatus
from taskqueue.db.database import make_engine, make_session_factory
from taskqueue.db.models import Job, JobStatusHistory, TaskQueueJob
from taskqueue.pilots.pilotreports import Beat, StatusReport, heartbeat, report_status
from taskqueue.pilots.records import PilotInfo, register_pilot
from taskqueue.queues.jobs import apply_transition, job_history
from taskqueue.queues.stalled import lock_silent_jobs, reschedule_silent_job
from tests.conftest import Database
from tests.helpers import claim, requirements, submit

S = JobStatus
PILOT = "pilot-1"
SITE = "LCG.Alpha.org"
REPO = Path(__file__).resolve().parents[2]
LEASE = timedelta(seconds=Settings().agents.job_lease)
LIMIT = timedelta(seconds=Settings().agents.stalled_limit)
MATCHED_LEASE = timedelta(seconds=Settings().agents.matched_lease)
SECOND = timedelta(seconds=1)


@dataclass
class Clock:
    at: datetime

    def __call__(self) -> datetime:
        return self.at


def agent_settings(settings: Settings, tmp_path: Path) -> Settings:
    resources = tmp_path / "resources.toml"
    shutil.copy(REPO / "conf" / "resources.toml", resources)
    return replace(settings, resources=ResourcesSettings(file=str(resources)))


@pytest.fixture()
def agent_cfg(settings: Settings, tmp_path: Path) -> Settings:
    return agent_settings(settings, tmp_path)


def context(db: Database, settings: Settings, at: datetime) -> AgentContext:
    return AgentContext(settings=settings, factory=db.factory, clock=Clock(at))


def watch(db: Database, settings: Settings, at: datetime, **kw: int) -> str:
    return watch_jobs(context(db, settings, at), **kw)


def stored(db: Database, job_id: int) -> Job:
    with db.factory() as s:
        job = s.get(Job, job_id)
    assert job is not None
    return job


def matched(db: Database, settings: Settings, now: datetime, n: int = 1,
            pilot: str = PILOT) -> list[int]:
    """``n`` jobs Matched to ``pilot`` at ``now``."""
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements(owner=f"{pilot}-owner")] * n)
        claims = claim(s, now, count=n, pilot_reference=pilot, site=SITE,
                       owner=f"{pilot}-owner")
    assert sorted(c.job_id for c in claims) == sorted(ids)
    return ids


def running(db: Database, settings: Settings, now: datetime, n: int = 1,
            pilot: str = PILOT) -> list[int]:
    """``n`` jobs their pilot reported Running at ``now``."""
    ids = matched(db, settings, now, n, pilot)
    with db.factory.begin() as s:
        for job_id in ids:
            report_status(s, job_id, StatusReport(S.RUNNING), vo="lhcb", pilot_reference=pilot,
                          now=now, max_reschedules=3)
    return ids


def statuses(history: list[JobStatusHistory]) -> list[str]:
    return [h.status for h in history]


def history_of(db: Database, job_id: int) -> list[JobStatusHistory]:
    with db.factory() as s:
        return job_history(s, job_id)


def in_a_queue(db: Database, job_id: int) -> bool:
    with db.factory() as s:
        return s.get(TaskQueueJob, job_id) is not None


# -- Running → Stalled → rescheduled ----------------------------------------------------------

def test_silent_running_job_stalls_after_its_lease(db: Database, agent_cfg: Settings,
                                                   now: datetime) -> None:
    (job_id,) = running(db, agent_cfg, now)
    summary = watch(db, agent_cfg, now + LEASE)  # exactly the lease: not longer
    assert stored(db, job_id).status == "Running"
    assert summary.startswith("0 stalled")
    summary = watch(db, agent_cfg, now + LEASE + timedelta(minutes=1))
    job = stored(db, job_id)
    assert (job.status, job.minor_status) == ("Stalled", "No heartbeat for 31 min")
    assert summary.startswith("1 stalled, 0 rescheduled")
    last = history_of(db, job_id)[-1]
    assert (last.status, last.source, last.at) == ("Stalled", "watchdog",
                                                   now + LEASE + timedelta(minutes=1))
    assert job.pilot_reference == PILOT and job.reschedule_count == 0


def test_stalled_job_is_rescheduled_after_the_stalled_limit(db: Database, agent_cfg: Settings,
                                                            now: datetime) -> None:
    (job_id,) = running(db, agent_cfg, now)
    watch(db, agent_cfg, now + LEASE + SECOND)
    watch(db, agent_cfg, now + LEASE + LIMIT)  # silent exactly lease + limit: kept
    assert stored(db, job_id).status == "Stalled"
    summary = watch(db, agent_cfg, now + LEASE + LIMIT + SECOND)
    job = stored(db, job_id)
    assert (job.status, job.reschedule_count) == ("Waiting", 1)
    assert (job.pilot_reference, job.started_at, job.heartbeat_at) == (None, None, None)
    assert in_a_queue(db, job_id)
    assert "1 rescheduled" in summary
    history = history_of(db, job_id)
    # Back in its queue, which only queues without an Executor serve in the example
    # configuration: the same turn says so in its minor status (taskqueue.queues.unrunnable).
    assert statuses(history)[-6:] == ["Stalled", "Rescheduled", "Received", "Checking",
                                      "Waiting", "Waiting"]
    assert history[-1].minor_status == NO_DIRECTOR_MINOR_STATUS
    rescheduled = [h for h in history if h.status == "Rescheduled"]
    assert len(rescheduled) == 1
    assert (rescheduled[0].minor_status, rescheduled[0].source) == (
        "Stalled: no heartbeat for 60 min", "watchdog")
    # Waiting again, it goes to another pilot.
    with db.factory.begin() as s:
        claims = claim(s, now + LEASE + LIMIT + 2 * SECOND, pilot_reference="pilot-2",
                       site=SITE, owner=f"{PILOT}-owner")
    assert [c.job_id for c in claims] == [job_id]


def test_a_job_rescheduled_too_often_fails_with_a_reason(db: Database, agent_cfg: Settings,
                                                          now: datetime) -> None:
    cfg = replace(agent_cfg, taskqueue=replace(agent_cfg.taskqueue, max_reschedules=1))
    (job_id,) = running(db, cfg, now)
    t = now + LEASE + SECOND
    watch(db, cfg, t)
    t += LIMIT
    watch(db, cfg, t)
    assert (stored(db, job_id).status, stored(db, job_id).reschedule_count) == ("Waiting", 1)
    # Its second attempt falls silent too.
    with db.factory.begin() as s:
        claim(s, t, pilot_reference="pilot-2", site=SITE, owner=f"{PILOT}-owner")
        report_status(s, job_id, StatusReport(S.RUNNING), vo="lhcb", pilot_reference="pilot-2",
                      now=t, max_reschedules=1)
    t += LEASE + SECOND
    watch(db, cfg, t)
    assert stored(db, job_id).status == "Stalled"
    t += LIMIT
    summary = watch(db, cfg, t)
    job = stored(db, job_id)
    assert (job.status, job.reschedule_count, job.ended_at) == ("Failed", 1, t)
    assert job.minor_status == ("Stalled: no heartbeat for 60 min; maximum of 1 reschedules "
                                "reached")
    assert "1 failed at the maximum" in summary
    assert not in_a_queue(db, job_id)
    assert statuses(history_of(db, job_id)).count("Rescheduled") == 1


# -- Matched, never started --------------------------------------------------------------------

def test_matched_job_never_started_returns_to_its_queue_uncounted(
        db: Database, agent_cfg: Settings, now: datetime) -> None:
    (job_id,) = matched(db, agent_cfg, now)
    watch(db, agent_cfg, now + MATCHED_LEASE)
    assert stored(db, job_id).status == "Matched"
    summary = watch(db, agent_cfg, now + MATCHED_LEASE + SECOND)
    job = stored(db, job_id)
    assert (job.status, job.reschedule_count, job.pilot_reference) == ("Waiting", 0, None)
    assert in_a_queue(db, job_id)
    assert "1 returned to their queue" in summary
    history = history_of(db, job_id)
    assert "Stalled" not in statuses(history)
    (back,) = [h for h in history if h.status == "Rescheduled"]
    assert back.minor_status == (f"Not started by pilot {PILOT} within 2 min of its match: "
                                 "back to its task queue")


def test_a_match_whose_pilot_never_got_it_comes_back_within_minutes(
        db: Database, agent_cfg: Settings, now: datetime) -> None:
    """A claim answered to a client that had gone (a request served late, after a database
    hang) is not confirmed by a Running report or a heartbeat: it is back in its queue after
    the short unconfirmed-match lease, not after the job lease."""
    (job_id,) = matched(db, agent_cfg, now)
    watch(db, agent_cfg, now + timedelta(seconds=121))
    job = stored(db, job_id)
    assert (job.status, job.reschedule_count, job.pilot_reference) == ("Waiting", 0, None)


def test_matched_job_at_the_maximum_still_returns_to_its_queue(
        db: Database, agent_cfg: Settings, now: datetime) -> None:
    cfg = replace(agent_cfg, taskqueue=replace(agent_cfg.taskqueue, max_reschedules=0))
    (job_id,) = matched(db, cfg, now)
    watch(db, cfg, now + MATCHED_LEASE + SECOND)
    assert (stored(db, job_id).status, stored(db, job_id).reschedule_count) == ("Waiting", 0)


def test_matched_job_its_pilot_beats_for_is_kept(db: Database, agent_cfg: Settings,
                                                 now: datetime) -> None:
    (job_id,) = matched(db, agent_cfg, now)
    with db.factory.begin() as s:
        heartbeat(s, vo="lhcb", pilot_reference=PILOT, beats=[Beat(job_id)],
                  now=now + MATCHED_LEASE - SECOND)
    watch(db, agent_cfg, now + MATCHED_LEASE + SECOND)
    assert stored(db, job_id).status == "Matched"


# -- dead pilots -------------------------------------------------------------------------------

def set_pilot(db: Database, status: str, now: datetime, reference: str = PILOT) -> None:
    with db.factory.begin() as s:
        register_pilot(s, "lhcb", PilotInfo(reference, SITE, "ce.alpha.org", "q", status),
                       now=now)


def test_jobs_of_a_dead_pilot_are_rescheduled_at_once(db: Database, agent_cfg: Settings,
                                                      now: datetime) -> None:
    run_id, unstarted_id = (running(db, agent_cfg, now)[0], matched(db, agent_cfg, now)[0])
    (other_id,) = running(db, agent_cfg, now, pilot="pilot-2")
    set_pilot(db, "Running", now)
    set_pilot(db, "Running", now, "pilot-2")
    later = now + timedelta(minutes=1)
    watch(db, agent_cfg, later)
    assert {stored(db, j).status for j in (run_id, unstarted_id, other_id)} == {
        "Running", "Matched"}
    set_pilot(db, "Lost", later)
    summary = watch(db, agent_cfg, later)  # no silence needed
    job = stored(db, run_id)
    assert (job.status, job.reschedule_count) == ("Waiting", 1)
    (why,) = [h for h in history_of(db, run_id) if h.status == "Rescheduled"]
    assert (why.minor_status, why.source) == (f"Pilot {PILOT} is Lost", "watchdog")
    # The job the dead pilot never started goes back without counting.
    assert (stored(db, unstarted_id).status, stored(db, unstarted_id).reschedule_count) == (
        "Waiting", 0)
    assert stored(db, other_id).status == "Running"
    assert "2 of dead pilots rescheduled" in summary


def test_stalled_job_of_a_failed_pilot_is_rescheduled(db: Database, agent_cfg: Settings,
                                                      now: datetime) -> None:
    (job_id,) = running(db, agent_cfg, now)
    watch(db, agent_cfg, now + LEASE + SECOND)
    assert stored(db, job_id).status == "Stalled"
    set_pilot(db, "Failed", now + LEASE + 2 * SECOND)
    watch(db, agent_cfg, now + LEASE + 3 * SECOND)
    assert (stored(db, job_id).status, stored(db, job_id).reschedule_count) == ("Waiting", 1)


# -- a job that speaks again -------------------------------------------------------------------

def test_stalled_job_that_beats_again_runs_on(db: Database, agent_cfg: Settings,
                                              now: datetime) -> None:
    (job_id,) = running(db, agent_cfg, now)
    watch(db, agent_cfg, now + LEASE + SECOND)
    assert stored(db, job_id).status == "Stalled"
    beat_at = now + LEASE + timedelta(minutes=5)
    with db.factory.begin() as s:
        assert heartbeat(s, vo="lhcb", pilot_reference=PILOT, beats=[Beat(job_id)],
                         now=beat_at) == {}
    assert stored(db, job_id).status == "Running"
    watch(db, agent_cfg, now + LEASE + LIMIT + SECOND)  # past the limit of the old silence
    job = stored(db, job_id)
    assert (job.status, job.reschedule_count, job.pilot_reference) == ("Running", 0, PILOT)
    assert "Rescheduled" not in statuses(history_of(db, job_id))
    watch(db, agent_cfg, beat_at + LEASE + SECOND)  # a new silence
    assert stored(db, job_id).status == "Stalled"


def test_a_job_that_spoke_since_it_was_selected_is_left_alone(
        db: Database, agent_cfg: Settings, now: datetime) -> None:
    (job_id,) = running(db, agent_cfg, now)
    watch(db, agent_cfg, now + LEASE + SECOND)
    late = now + LEASE + LIMIT + SECOND
    with db.factory.begin() as s:
        (selected,) = lock_silent_jobs(s, [S.STALLED], silent_before=late - LEASE - LIMIT,
                                       limit=10)
    with db.factory.begin() as s:  # the pilot beats after the watchdog's selection
        heartbeat(s, vo="lhcb", pilot_reference=PILOT, beats=[Beat(job_id)], now=late)
        s.execute(update(Job).where(Job.id == job_id).values(status="Stalled"))
    with db.factory.begin() as s:
        assert reschedule_silent_job(s, selected, now=late, reason="r", max_reschedules=3) is None
    assert (stored(db, job_id).status, stored(db, job_id).reschedule_count) == ("Stalled", 0)
    with db.factory.begin() as s:  # and one that is not Stalled any more
        s.execute(update(Job).where(Job.id == job_id).values(status="Running"))
    with db.factory.begin() as s:
        (fresh,) = lock_silent_jobs(s, [S.RUNNING], silent_before=late + SECOND, limit=10)
        s.execute(update(Job).where(Job.id == job_id).values(status="Completing"))
        assert reschedule_silent_job(s, fresh, now=late, reason="r", max_reschedules=3) is None
        assert s.scalar(select(Job.status).where(Job.id == job_id)) == "Completing"


def test_many_jobs_in_small_batches(db: Database, agent_cfg: Settings, now: datetime) -> None:
    ids = running(db, agent_cfg, now, 11)
    summary = watch(db, agent_cfg, now + LEASE + SECOND, batch=3)
    assert summary.startswith("11 stalled")
    assert {stored(db, j).status for j in ids} == {"Stalled"}
    summary = watch(db, agent_cfg, now + LEASE + LIMIT + 2 * SECOND, batch=3)
    assert "11 rescheduled" in summary
    with db.factory() as s:
        counts = dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())
    assert counts == {"Waiting": 11}


# -- two watchdogs at once -------------------------------------------------------------------

def _watchdog(url: str, resources: str, at: datetime, start_at: float) -> str:
    settings = replace(Settings(), resources=ResourcesSettings(file=resources))
    engine = make_engine(url, pool_size=1)
    try:
        ctx = AgentContext(settings=settings, factory=make_session_factory(engine),
                           clock=Clock(at))
        time.sleep(max(0.0, start_at - time.time()))
        return watch_jobs(ctx, batch=7)
    finally:
        engine.dispose()


def _counts(summaries: list[str]) -> Counter[str]:
    total: Counter[str] = Counter()
    for summary in summaries:
        for part in summary.split(", "):
            number, what = part.split(" ", 1)
            total[what] += int(number)
    return total


@pytest.mark.slow
def test_two_watchdogs_reschedule_each_job_exactly_once(db: Database, agent_cfg: Settings,
                                                        now: datetime) -> None:
    # On SQLite the two processes take turns (one writer at a time); on the servers they race.
    n = 300
    with db.factory.begin() as s:
        ids = submit(s, agent_cfg, now, [requirements(owner=f"u{i % 5}") for i in range(n)])
        claims = claim(s, now, count=n, pilot_reference=PILOT, site=SITE)
        assert len(claims) == n
        apply_transition(s, ids, S.MATCHED, S.RUNNING, minor_status="Application started",
                         source="pilot", now=now, values={"started_at": now})
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        for at in (now + LEASE + SECOND, now + LEASE + LIMIT + 2 * SECOND):
            start_at = time.time() + 3.0  # let both processes connect first
            summaries = pool.starmap(_watchdog, [(db.url, agent_cfg.resources.file, at,
                                                  start_at)] * 2)
            done = _counts(summaries)
            assert done["stalled"] == (n if at == now + LEASE + SECOND else 0)
            if db.is_server:  # both took part: the race happened (SQLite takes turns)
                assert all(sum(_counts([one]).values()) > 0 for one in summaries), summaries
    assert done["rescheduled"] == n
    with db.factory() as s:
        counts = dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())
        per_job = s.execute(
            select(JobStatusHistory.status, JobStatusHistory.job_id, func.count())
            .where(JobStatusHistory.status.in_(["Stalled", "Rescheduled"]))
            .group_by(JobStatusHistory.status, JobStatusHistory.job_id)).all()
        count_values = set(s.scalars(select(Job.reschedule_count)))
        queued = s.scalar(select(func.count()).select_from(TaskQueueJob))
    assert counts == {"Waiting": n}
    # One Stalled and one Rescheduled row per job, no more.
    assert sorted((st, job, c) for st, job, c in per_job) == sorted(
        [("Rescheduled", j, 1) for j in ids] + [("Stalled", j, 1) for j in ids])
    assert count_values == {1} and queued == n


def test_watchdog_summary_parses(db: Database, agent_cfg: Settings, now: datetime) -> None:
    """The one-line summary lists every kind of action with its number."""
    summary = watch(db, agent_cfg, now)
    assert set(_counts([summary])) == {
        "stalled", "rescheduled", "of dead pilots rescheduled",
        "returned to their queue unstarted", "failed at the maximum of reschedules",
        "failed in the optimizer chain", "waiting jobs no queue can run",
        "no queue with an Executor can run", "runnable again", "failed for it"}
    assert sum(_counts([summary]).values()) == 0
