"""What owners, operators and agents do to a job: kill, delete, reschedule.

Each action reads the job's status under a row lock, takes the job out of its task queue if it
waits in one, and moves it through the state machine (taskqueue.queues.jobs). A job that a
pilot holds is not signalled from here: its pilot learns at its next heartbeat that the job is no
longer its to run (taskqueue.pilots.pilotreports).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from taskqueue.core.errors import IllegalTransitionError, NotFoundError
from taskqueue.core.states import FINAL_STATES, JobStatus, is_allowed
from taskqueue.db.models import Job, jobs_table
from taskqueue.queues.jobs import apply_transition
from taskqueue.queues.taskqueues import remove_jobs_from_queues

S = JobStatus

#: Columns cleared when a job goes back to the optimizer chain for a new attempt.
_NEW_ATTEMPT = {"pilot_reference": None, "site": None, "ce": None, "started_at": None,
                "ended_at": None, "heartbeat_at": None, "exit_code": None,
                "output_tail": None, "cpu_used": None, "progress": None}


def lock_job(session: Session, job_id: int) -> Job:
    """The job, its row locked for this transaction."""
    job = session.get(Job, job_id, with_for_update=True, populate_existing=True)
    if job is None:
        raise NotFoundError(f"job {job_id} does not exist")
    return job


def kill_job(session: Session, job_id: int, *, by: str, now: datetime,
             reason: str = "") -> JobStatus:
    """Stop a job wherever it is; returns its new status (Killed)."""
    job = lock_job(session, job_id)
    current = JobStatus(job.status)
    if current in FINAL_STATES:
        raise IllegalTransitionError(f"job {job_id} is already {current}; nothing to kill")
    if current == S.WAITING:
        remove_jobs_from_queues(session, [job_id], now=now)
    apply_transition(session, [job_id], current, S.KILLED,
                     minor_status=(reason or f"Killed by {by}")[:255], source=by, now=now,
                     values={"ended_at": now})
    return S.KILLED


def delete_job(session: Session, job_id: int, *, by: str, now: datetime) -> JobStatus:
    """Delete a job; one that is still active is killed first (its pilot then stops it)."""
    job = lock_job(session, job_id)
    current = JobStatus(job.status)
    if current == S.DELETED:
        raise IllegalTransitionError(f"job {job_id} is already Deleted")
    if not is_allowed(current, S.DELETED):
        kill_job(session, job_id, by=by, now=now, reason=f"Deleted by {by}")
        current = S.KILLED
    elif current == S.WAITING:
        remove_jobs_from_queues(session, [job_id], now=now)
    apply_transition(session, [job_id], current, S.DELETED, minor_status=f"Deleted by {by}",
                     source=by, now=now, values={} if job.ended_at else {"ended_at": now})
    return S.DELETED


def reschedule_job(session: Session, job_id: int, *, by: str, now: datetime, reason: str,
                   max_reschedules: int, fail_when_exhausted: bool,
                   count: bool = True) -> JobStatus:
    """Send a job back to the optimizer chain for a new attempt: it becomes Received (the
    caller runs the chain), its reschedule count one higher.

    Once a job has been rescheduled ``max_reschedules`` times, the next reschedule fails it
    (``fail_when_exhausted``: what a pilot's or an agent's reschedule does) or is refused (an
    owner's or operator's request). With ``count`` false the job goes back without it being
    an attempt (a Matched job its pilot never started): its count stays and the maximum does
    not apply.
    """
    job = lock_job(session, job_id)
    current = JobStatus(job.status)
    if not is_allowed(current, S.RESCHEDULED):
        raise IllegalTransitionError(
            f"job {job_id} is {current}; only a job that waits, runs or has ended can be "
            "rescheduled")
    if count and job.reschedule_count >= max_reschedules:
        message = (f"job {job_id} has been rescheduled {job.reschedule_count} times, the "
                   f"maximum")
        if not fail_when_exhausted:
            raise IllegalTransitionError(message)
        if current in FINAL_STATES:
            return current
        if current == S.WAITING:
            remove_jobs_from_queues(session, [job_id], now=now)
        apply_transition(session, [job_id], current, S.FAILED,
                         minor_status=f"{reason}; maximum of {max_reschedules} reschedules "
                         "reached"[:255], source=by, now=now, values={"ended_at": now})
        return S.FAILED
    if current == S.WAITING:
        remove_jobs_from_queues(session, [job_id], now=now)
    apply_transition(session, [job_id], current, S.RESCHEDULED, minor_status=reason[:255],
                     source=by, now=now)
    apply_transition(session, [job_id], S.RESCHEDULED, S.RECEIVED,
                     minor_status="Job rescheduled", source=by, now=now,
                     values={**_NEW_ATTEMPT, **(
                         {"reschedule_count": jobs_table.c.reschedule_count + 1} if count
                         else {})})
    return S.RECEIVED



def owners_of(session: Session, job_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
    """(VO, owner) of each job of ``job_ids`` that exists: who may act on it."""
    if not job_ids:
        return {}
    return {row.id: (row.vo, row.owner) for row in session.execute(
        select(Job.id, Job.vo, Job.owner).where(Job.id.in_(list(job_ids))))}


def statuses_of(session: Session, job_ids: Sequence[int]) -> list[tuple[int, str, str]]:
    """(id, status, minor status) of the jobs of ``job_ids``, by id."""
    if not job_ids:
        return []
    return [(row.id, row.status, row.minor_status) for row in session.execute(
        select(Job.id, Job.status, Job.minor_status).where(Job.id.in_(list(job_ids)))
        .order_by(Job.id))]


def fail_unreadable(session: Session, job_id: int, pilot_reference: str, reason: str, *,
                    now: datetime) -> bool:
    """Fail a job matched to ``pilot_reference`` whose stored description can no longer be read
    (it was accepted by an earlier version's reader), with ``reason`` as its minor status:
    handing it back to its queue would draw it again and again. False when the job is no longer
    that pilot's Matched job (nothing is changed then)."""
    job = lock_job(session, job_id)
    if job.status != S.MATCHED or job.pilot_reference != pilot_reference:
        return False
    apply_transition(session, [job_id], S.MATCHED, S.FAILED, minor_status=reason[:255],
                     source="matcher", now=now, values={"ended_at": now})
    return True
