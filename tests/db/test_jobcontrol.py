"""Kill, delete and reschedule: what owners, operators and agents do to a job."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from taskqueue.core.definitions import JobRequirements
from taskqueue.core.errors import IllegalTransitionError, NotFoundError
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db.models import Job, TaskQueue, TaskQueueJob
from taskqueue.queues.jobcontrol import delete_job, kill_job, reschedule_job
from taskqueue.queues.jobs import JobFilter, apply_transition, find_jobs, job_history, jobs_by_id
from taskqueue.queues.taskqueues import QueueEntry, enqueue_jobs
from tests.conftest import Database
from tests.helpers import claim, requirements, submit

S = JobStatus
SITE = "LCG.Alpha.org"


def stored(db: Database, job_id: int) -> Job:
    with db.factory() as s:
        job = s.get(Job, job_id)
    assert job is not None
    return job


def statuses(db: Database, job_id: int) -> list[str]:
    with db.factory() as s:
        return [h.status for h in job_history(s, job_id)]


def queued(db: Database, job_id: int) -> bool:
    with db.factory() as s:
        return s.get(TaskQueueJob, job_id) is not None


def matched_job(db: Database, settings: Settings, now: datetime) -> int:
    """One job, Matched to pilot-1 at SITE/ce1."""
    with db.factory.begin() as s:
        (job_id,) = submit(s, settings, now, [requirements()])
        (c,) = claim(s, now, site=SITE, ce="ce1")
    assert c.job_id == job_id
    return job_id


def running_job(db: Database, settings: Settings, now: datetime) -> int:
    job_id = matched_job(db, settings, now)
    with db.factory.begin() as s:
        apply_transition(s, [job_id], S.MATCHED, S.RUNNING, minor_status="Application started",
                         source="pilot", now=now, values={"started_at": now})
    return job_id


def requeue(session: Session, settings: Settings, now: datetime, job_id: int,
            reqs: JobRequirements) -> None:
    """What the optimizer chain does with a Received job: Checking, then its task queue."""
    apply_transition(session, [job_id], S.RECEIVED, S.CHECKING, minor_status="checks",
                     source="test", now=now)
    enqueue_jobs(session, [QueueEntry(job_id, reqs)], settings, now=now)


# -- kill -----------------------------------------------------------------------------------

def test_kill_a_waiting_job_takes_it_out_of_its_queue(db: Database, settings: Settings,
                                                      now: datetime) -> None:
    with db.factory.begin() as s:
        killed, other = submit(s, settings, now, [requirements()] * 2)
    later = now + timedelta(minutes=1)
    with db.factory.begin() as s:
        assert kill_job(s, killed, by="alice", now=later) is S.KILLED
    job = stored(db, killed)
    assert (job.status, job.minor_status, job.ended_at) == ("Killed", "Killed by alice", later)
    assert not queued(db, killed) and queued(db, other)
    assert statuses(db, killed)[-2:] == ["Waiting", "Killed"]
    with db.factory.begin() as s:
        assert [c.job_id for c in claim(s, later, count=5)] == [other]


def test_kill_a_matched_job(db: Database, settings: Settings, now: datetime) -> None:
    job_id = matched_job(db, settings, now)
    with db.factory.begin() as s:
        assert kill_job(s, job_id, by="operator", now=now, reason="Bad input") is S.KILLED
    job = stored(db, job_id)
    assert (job.status, job.minor_status) == ("Killed", "Bad input")
    assert statuses(db, job_id)[-2:] == ["Matched", "Killed"]


def test_kill_a_running_job(db: Database, settings: Settings, now: datetime) -> None:
    job_id = running_job(db, settings, now)
    with db.factory.begin() as s:
        kill_job(s, job_id, by="alice", now=now)
    job = stored(db, job_id)
    assert job.status == "Killed" and job.ended_at == now
    assert statuses(db, job_id)[-2:] == ["Running", "Killed"]


@pytest.mark.parametrize("final", [S.DONE, S.FAILED, S.KILLED])
def test_kill_of_an_ended_job_is_refused(db: Database, settings: Settings, now: datetime,
                                         final: JobStatus) -> None:
    job_id = running_job(db, settings, now)
    with db.factory.begin() as s:
        apply_transition(s, [job_id], S.RUNNING, final, minor_status="ended", source="test",
                         now=now)
    with db.factory.begin() as s, pytest.raises(IllegalTransitionError):
        kill_job(s, job_id, by="alice", now=now)
    assert stored(db, job_id).status == final.value
    assert statuses(db, job_id).count(final.value) == 1


def test_kill_of_an_unknown_job(db: Database, now: datetime) -> None:
    with db.factory.begin() as s, pytest.raises(NotFoundError):
        kill_job(s, 424242, by="alice", now=now)


# -- delete ---------------------------------------------------------------------------------

def test_delete_a_running_job_kills_it_first(db: Database, settings: Settings,
                                             now: datetime) -> None:
    job_id = running_job(db, settings, now)
    later = now + timedelta(minutes=3)
    with db.factory.begin() as s:
        assert delete_job(s, job_id, by="alice", now=later) is S.DELETED
    job = stored(db, job_id)
    assert job.status == "Deleted" and job.ended_at == later
    with db.factory() as s:
        history = [(h.status, h.minor_status) for h in job_history(s, job_id)]
    assert history[-2:] == [("Killed", "Deleted by alice"), ("Deleted", "Deleted by alice")]


def test_delete_a_waiting_job(db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        (job_id,) = submit(s, settings, now, [requirements()])
    with db.factory.begin() as s:
        delete_job(s, job_id, by="alice", now=now)
    assert stored(db, job_id).status == "Deleted"
    assert statuses(db, job_id)[-2:] == ["Waiting", "Deleted"]
    assert not queued(db, job_id)
    with db.factory.begin() as s:
        assert claim(s, now) == []


def test_delete_an_ended_job_keeps_its_end_time(db: Database, settings: Settings,
                                                now: datetime) -> None:
    job_id = running_job(db, settings, now)
    with db.factory.begin() as s:
        apply_transition(s, [job_id], S.RUNNING, S.DONE, minor_status="done", source="pilot",
                         now=now, values={"ended_at": now})
    with db.factory.begin() as s:
        delete_job(s, job_id, by="alice", now=now + timedelta(days=1))
    job = stored(db, job_id)
    assert job.status == "Deleted" and job.ended_at == now
    assert statuses(db, job_id)[-2:] == ["Done", "Deleted"]


def test_delete_twice_is_refused(db: Database, settings: Settings, now: datetime) -> None:
    job_id = matched_job(db, settings, now)
    with db.factory.begin() as s:
        delete_job(s, job_id, by="alice", now=now)
    with db.factory.begin() as s, pytest.raises(IllegalTransitionError):
        delete_job(s, job_id, by="alice", now=now)
    assert statuses(db, job_id).count("Deleted") == 1


# -- reschedule -----------------------------------------------------------------------------

def test_reschedule_a_running_job(db: Database, settings: Settings, now: datetime) -> None:
    job_id = running_job(db, settings, now)
    with db.factory.begin() as s:
        s.execute(Job.__table__.update().where(Job.id == job_id).values(
            cpu_used=12.5, progress="half", exit_code=3, output_tail="out"))
    later = now + timedelta(minutes=5)
    with db.factory.begin() as s:
        status = reschedule_job(s, job_id, by="operator", now=later, reason="Site trouble",
                                max_reschedules=3, fail_when_exhausted=False)
    assert status is S.RECEIVED
    job = stored(db, job_id)
    assert (job.status, job.reschedule_count) == ("Received", 1)
    assert (job.pilot_reference, job.site, job.ce, job.started_at, job.ended_at,
            job.heartbeat_at, job.exit_code, job.output_tail, job.cpu_used,
            job.progress) == (None,) * 10
    with db.factory() as s:
        history = [(h.status, h.minor_status, h.source) for h in job_history(s, job_id)]
    assert history[-2:] == [("Rescheduled", "Site trouble", "operator"),
                            ("Received", "Job rescheduled", "operator")]


def test_reschedule_a_waiting_job_takes_it_out_of_its_queue(db: Database, settings: Settings,
                                                            now: datetime) -> None:
    with db.factory.begin() as s:
        (job_id,) = submit(s, settings, now, [requirements()])
    with db.factory.begin() as s:
        reschedule_job(s, job_id, by="alice", now=now, reason="again", max_reschedules=3,
                       fail_when_exhausted=False)
    assert stored(db, job_id).status == "Received"
    assert not queued(db, job_id)
    with db.factory.begin() as s:
        assert claim(s, now) == []


def test_rescheduled_job_comes_back_for_another_pilot(db: Database, settings: Settings,
                                                      now: datetime) -> None:
    reqs = requirements()
    job_id = matched_job(db, settings, now)
    with db.factory.begin() as s:
        reschedule_job(s, job_id, by="matcher", now=now, reason="Pilot lost",
                       max_reschedules=3, fail_when_exhausted=True)
        requeue(s, settings, now, job_id, reqs)
    with db.factory.begin() as s:
        (c,) = claim(s, now, pilot_reference="pilot-2", site="LCG.Beta.org")
    assert c.job_id == job_id
    job = stored(db, job_id)
    assert (job.status, job.pilot_reference, job.site, job.reschedule_count) == (
        "Matched", "pilot-2", "LCG.Beta.org", 1)


def test_reschedule_refused_after_the_maximum(db: Database, settings: Settings,
                                              now: datetime) -> None:
    reqs = requirements()
    with db.factory.begin() as s:
        (job_id,) = submit(s, settings, now, [reqs])
    for _ in range(2):
        with db.factory.begin() as s:
            reschedule_job(s, job_id, by="alice", now=now, reason="again", max_reschedules=2,
                           fail_when_exhausted=False)
            requeue(s, settings, now, job_id, reqs)
    assert stored(db, job_id).reschedule_count == 2
    with db.factory.begin() as s, pytest.raises(IllegalTransitionError, match="maximum"):
        reschedule_job(s, job_id, by="alice", now=now, reason="again", max_reschedules=2,
                       fail_when_exhausted=False)
    job = stored(db, job_id)
    assert (job.status, job.reschedule_count) == ("Waiting", 2)
    assert queued(db, job_id)


def test_reschedule_past_the_maximum_fails_a_running_job(db: Database, settings: Settings,
                                                         now: datetime) -> None:
    job_id = running_job(db, settings, now)
    with db.factory.begin() as s:
        status = reschedule_job(s, job_id, by="watchdog", now=now, reason="Stalled",
                                max_reschedules=0, fail_when_exhausted=True)
    assert status is S.FAILED
    job = stored(db, job_id)
    assert job.status == "Failed" and job.ended_at == now and job.reschedule_count == 0
    assert "Stalled" in job.minor_status and "maximum of 0 reschedules" in job.minor_status
    assert statuses(db, job_id)[-2:] == ["Running", "Failed"]


def test_reschedule_past_the_maximum_fails_a_waiting_job_and_unqueues_it(
        db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        failed, other = submit(s, settings, now, [requirements()] * 2)
    with db.factory.begin() as s:
        status = reschedule_job(s, failed, by="operator", now=now, reason="Bad input",
                                max_reschedules=0, fail_when_exhausted=True)
    assert status is S.FAILED
    assert stored(db, failed).status == "Failed"
    # A Failed job must not stay in its task queue: a claim would take it and find it is
    # no longer Waiting.
    assert not queued(db, failed)
    with db.factory.begin() as s:
        assert [c.job_id for c in claim(s, now, count=5)] == [other]


def test_reschedule_of_a_received_job_is_refused(db: Database, settings: Settings,
                                                 now: datetime) -> None:
    job_id = matched_job(db, settings, now)
    with db.factory.begin() as s:
        reschedule_job(s, job_id, by="alice", now=now, reason="again", max_reschedules=3,
                       fail_when_exhausted=False)
    with db.factory.begin() as s, pytest.raises(IllegalTransitionError):
        reschedule_job(s, job_id, by="alice", now=now, reason="again", max_reschedules=3,
                       fail_when_exhausted=False)
    assert stored(db, job_id).reschedule_count == 1


def test_reschedule_an_ended_job(db: Database, settings: Settings, now: datetime) -> None:
    job_id = running_job(db, settings, now)
    with db.factory.begin() as s:
        apply_transition(s, [job_id], S.RUNNING, S.FAILED, minor_status="exit 1",
                         source="pilot", now=now, values={"ended_at": now, "exit_code": 1})
    with db.factory.begin() as s:
        assert reschedule_job(s, job_id, by="alice", now=now, reason="retry",
                              max_reschedules=3, fail_when_exhausted=False) is S.RECEIVED
    job = stored(db, job_id)
    assert (job.status, job.exit_code, job.ended_at, job.reschedule_count) == (
        "Received", None, None, 1)


# -- listings -------------------------------------------------------------------------------

def test_find_jobs_and_jobs_by_id(db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements(owner=f"u{i % 2}") for i in range(5)])
        submit(s, settings, now, [requirements(vo="belle")])
        (c,) = claim(s, now, site=SITE, owner="u1")
        kill_job(s, ids[0], by="op", now=now)
    with db.factory() as s:
        assert [j.id for j in find_jobs(s, JobFilter(vo="lhcb"))] == ids
        assert [j.id for j in find_jobs(s, JobFilter(vo="lhcb"), after=ids[1], limit=2)] == \
            ids[2:4]
        assert [j.id for j in find_jobs(s, JobFilter(vo="lhcb", status="Waiting"))] == \
            [i for i in ids[1:] if i != c.job_id]
        assert [j.id for j in find_jobs(s, JobFilter(vo="lhcb", site=SITE))] == [c.job_id]
        assert [j.id for j in find_jobs(s, JobFilter(vo="lhcb", owner="u0",
                                                     status="Killed"))] == [ids[0]]
        assert find_jobs(s, JobFilter(vo="lhcb", job_type="MC")) == []
        assert [j.id for j in jobs_by_id(s, [ids[3], 999999, ids[1]])] == [ids[1], ids[3]]
        assert jobs_by_id(s, []) == []
        total = s.scalar(select(func.count()).select_from(Job))
    assert total == 6


@pytest.mark.parametrize("action", ["kill", "delete", "reschedule"])
def test_a_queue_emptied_by_an_action_stops_being_a_candidate_at_once(
        db: Database, settings: Settings, now: datetime, action: str) -> None:
    with db.factory.begin() as s:
        (gone,) = submit(s, settings, now, [requirements(owner="a")])
        (kept,) = submit(s, settings, now, [requirements(owner="b")])
        queues = dict(s.execute(select(TaskQueueJob.job_id, TaskQueueJob.tq_id)).all())
    later = now + timedelta(minutes=1)
    with db.factory.begin() as s:
        if action == "kill":
            kill_job(s, gone, by="alice", now=later)
        elif action == "delete":
            delete_job(s, gone, by="alice", now=later)
        else:
            reschedule_job(s, gone, by="alice", now=later, reason="again",
                           max_reschedules=5, fail_when_exhausted=False)
    with db.factory() as s:
        emptied = s.get(TaskQueue, queues[gone])
        full = s.get(TaskQueue, queues[kept])
        assert emptied is not None and full is not None
        assert (emptied.active, emptied.emptied_at) == (0, later)
        assert (full.active, full.emptied_at) == (1, None)
