"""The state machine on stored jobs: one function, illegal moves refused, history appended."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from taskqueue.core.errors import ConflictError, IllegalTransitionError, NotFoundError
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db.models import Job, JobStatusHistory
from taskqueue.queues.jobs import NewJob, add_jobs, apply_transition, job_history, set_job_status
from tests.conftest import Database
from tests.helpers import claim, requirements, submit


def test_legal_move_is_recorded(db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        (job_id,) = submit(s, settings, now, [requirements()])
        claim(s, now)
    later = now + timedelta(minutes=1)
    with db.factory.begin() as s:
        previous = set_job_status(s, job_id, JobStatus.RUNNING, minor_status="Application",
                                  source="pilot", now=later, values={"started_at": later})
    assert previous is JobStatus.MATCHED
    with db.factory() as s:
        job = s.get(Job, job_id)
        history = [(h.status, h.source) for h in job_history(s, job_id)]
    assert job is not None and job.status == "Running" and job.started_at == later
    assert job.minor_status == "Application"
    assert history == [("Received", "submit"), ("Checking", "test"),
                       ("Waiting", "optimizer"), ("Matched", "matcher"), ("Running", "pilot")]


def test_illegal_move_changes_nothing(db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        (job_id,) = submit(s, settings, now, [requirements()])
    with db.factory.begin() as s, pytest.raises(
        IllegalTransitionError, match=f"job {job_id} is Waiting and cannot go to Running"
    ):
        set_job_status(s, job_id, JobStatus.RUNNING, minor_status="", source="pilot", now=now)
    with db.factory() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "Waiting"
        assert len(job_history(s, job_id)) == 3


def test_guarded_bulk_move_detects_a_concurrent_change(db: Database, settings: Settings,
                                                       now: datetime) -> None:
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements()] * 3)
        claim(s, now)  # one of them is Matched now
    # Even a caller that catches the error and commits keeps none of the move.
    with db.factory.begin() as s, pytest.raises(
        ConflictError, match="1 of 3 jobs were no longer Waiting"
    ):
        apply_transition(s, ids, JobStatus.WAITING, JobStatus.KILLED, minor_status="",
                         source="operator", now=now)
    with db.factory() as s:
        statuses = sorted(s.get(Job, i).status for i in ids)  # type: ignore[union-attr]
    assert statuses == ["Matched", "Waiting", "Waiting"]  # the failed move rolled back


def test_unknown_job(db: Database, now: datetime) -> None:
    with db.factory.begin() as s, pytest.raises(NotFoundError, match="job 999999 does not exist"):
        set_job_status(s, 999999, JobStatus.KILLED, minor_status="", source="x", now=now)


def test_reschedule_goes_back_through_rescheduled(db: Database, settings: Settings,
                                                  now: datetime) -> None:
    with db.factory.begin() as s:
        (job_id,) = submit(s, settings, now, [requirements()])
        claim(s, now)
        set_job_status(s, job_id, JobStatus.RESCHEDULED, minor_status="Stalled", source="x",
                       now=now, values={"reschedule_count": Job.reschedule_count + 1})
        set_job_status(s, job_id, JobStatus.RECEIVED, minor_status="", source="x", now=now)
        job = s.get(Job, job_id)
        s.refresh(job)  # type: ignore[arg-type]
    assert job is not None and job.status == "Received" and job.reschedule_count == 1


@pytest.mark.parametrize("count", [1, 3, 250])
def test_add_jobs_returns_each_jobs_id_in_the_order_given(db: Database, now: datetime,
                                                          count: int) -> None:
    """The ids come back in the order of the jobs given, whatever order the database
    returns the inserted rows in: each id holds the job given at its place."""
    jobs = [NewJob(f'[Executable = "job{i}"]', requirements(), i % 7, "jdl", i)
            for i in range(count)]
    with db.factory.begin() as s:
        ids = add_jobs(s, jobs, now=now)
    with db.factory() as s:
        stored = {j.id: (j.description, j.bulk_index, j.user_priority)
                  for j in s.query(Job).filter(Job.id.in_(ids))}
    assert [stored[i] for i in ids] == [(j.description, j.bulk_index, j.user_priority)
                                        for j in jobs]


#: Texts the statement that stores new jobs must carry exactly (on PostgreSQL each column that
#: varies between the jobs travels as one JSON array): quotes, backslashes, escapes' look-alikes,
#: control characters, non-Latin and astral characters, and the word null.
AWKWARD = ['say "hi"', "back\\slash", "\\u0041 stays six characters", "tab\there\nnewline",
           "é漢字", "🚀 astral", "null", "[1, 2]", "", " padded "]


def test_new_jobs_keep_awkward_texts_and_missing_values_exactly(db: Database,
                                                                  now: datetime) -> None:
    """Each job's texts, bulk index and absent values come back exactly as given, whatever
    characters they hold, with the submission's time to the microsecond."""
    at = now.replace(microsecond=123456)
    jobs = [NewJob(f'[Executable = "{i}"; Arguments = "{text}"]', requirements(), i % 3 + 1,
                   "jdl", i if i % 2 else None, job_name=text if i % 3 else None,
                   job_group=None if i % 4 else text)
            for i, text in enumerate(AWKWARD)]
    with db.factory.begin() as s:
        ids = add_jobs(s, jobs, now=at)
    with db.factory() as s:
        stored = {j.id: j for j in s.query(Job).filter(Job.id.in_(ids))}
    for job_id, given in zip(ids, jobs, strict=True):
        row = stored[job_id]
        assert (row.description, row.bulk_index, row.user_priority, row.job_name,
                row.job_group) == (given.description, given.bulk_index, given.user_priority,
                                   given.job_name, given.job_group)
        assert row.submitted_at == at
    with db.factory() as s:
        history = s.execute(select(JobStatusHistory.job_id, JobStatusHistory.at)
                            .where(JobStatusHistory.job_id.in_(ids))).all()
    assert sorted(job_id for job_id, _ in history) == sorted(ids)
    assert {when for _, when in history} == {at}
