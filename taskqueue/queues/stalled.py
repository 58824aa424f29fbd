"""Silent jobs: the queue operations of the stalled-job watchdog (agents.watchdog).

A job a pilot holds shows it is alive by its heartbeats (``jobs.heartbeat_at``, set when it is
matched and at every beat). The watchdog finds, in batches locked with SKIP LOCKED so that
several watchdogs share the work, the jobs that fell silent:

- Running or Matched jobs silent for longer than the job lease, which become Stalled;
- Stalled jobs silent for longer still, which are rescheduled (or failed at the maximum);
- Matched jobs their pilot never started, which go back to their task queue uncounted;
- jobs whose pilot is known to be dead, which are rescheduled at once.

Every change is guarded: the job is locked again and must still be in the status and have the
heartbeat it was selected with, so a job that spoke meanwhile, or that another watchdog
handled, is left alone, and one silence never reschedules a job twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from taskqueue.core.errors import ConflictError, IllegalTransitionError
from taskqueue.core.states import JobStatus
from taskqueue.db.models import Job, Pilot
from taskqueue.queues.jobcontrol import lock_job, reschedule_job
from taskqueue.queues.jobs import apply_transition

S = JobStatus

SOURCE = "watchdog"
#: Pilot statuses after which a pilot runs nothing any more.
DEAD_PILOT_STATES: tuple[str, ...] = ("Done", "Failed", "Aborted", "Lost")
#: Job statuses in which a job lives on its pilot and can fall silent.
HELD_STATES: tuple[JobStatus, ...] = (S.MATCHED, S.RUNNING, S.STALLED)

#: The last sign of life of a job: its heartbeat, else its start, else its submission.
_LAST_SIGN = func.coalesce(Job.heartbeat_at, Job.started_at, Job.submitted_at)


@dataclass(frozen=True)
class SilentJob:
    """A job selected (and locked) by the watchdog, as it was when selected."""

    id: int
    status: JobStatus
    heartbeat_at: datetime | None
    last_sign: datetime
    started: bool
    pilot_reference: str | None
    #: The status of the job's pilot, for the jobs of dead pilots.
    pilot_status: str | None = None

    def silent_for(self, now: datetime) -> timedelta:
        return now - self.last_sign


def _columns() -> tuple[Any, ...]:
    return (Job.id, Job.status, Job.heartbeat_at, Job.started_at, Job.submitted_at,
            Job.pilot_reference)


def _silent_job(row: Any, pilot_status: str | None = None) -> SilentJob:
    last = row.heartbeat_at or row.started_at or row.submitted_at
    return SilentJob(row.id, JobStatus(row.status), row.heartbeat_at, last,
                     row.started_at is not None, row.pilot_reference, pilot_status)


def lock_silent_jobs(session: Session, statuses: Iterable[JobStatus], *,
                     silent_before: datetime, limit: int, after: int = 0,
                     never_started: bool = False) -> list[SilentJob]:
    """Up to ``limit`` jobs in ``statuses`` whose last sign of life is older than
    ``silent_before`` (with ``never_started``: only those their pilot never reported
    Running), of ids above ``after``, by id, locked for this transaction; jobs another
    transaction holds are skipped."""
    stmt = (select(*_columns())
            .where(Job.status.in_([s.value for s in statuses]), Job.id > after,
                   silent_before > _LAST_SIGN))
    if never_started:
        stmt = stmt.where(Job.started_at.is_(None))
    rows = session.execute(stmt.order_by(Job.id).limit(limit)
                           .with_for_update(skip_locked=True)).all()
    return [_silent_job(r) for r in rows]


def lock_jobs_of_dead_pilots(session: Session, *, limit: int, after: int = 0
                             ) -> list[SilentJob]:
    """Up to ``limit`` Matched, Running or Stalled jobs whose pilot's record says it is dead
    (Done, Failed, Aborted, Lost), of ids above ``after``, by id, locked for this transaction
    (the pilot rows are read, not locked); jobs another transaction holds are skipped."""
    dead = exists().where(Pilot.reference == Job.pilot_reference, Pilot.vo == Job.vo,
                          Pilot.status.in_(DEAD_PILOT_STATES))
    rows = session.execute(
        select(*_columns(), Job.vo)
        .where(Job.status.in_([s.value for s in HELD_STATES]), Job.id > after,
               Job.pilot_reference.is_not(None), dead)
        .order_by(Job.id).limit(limit).with_for_update(skip_locked=True)).all()
    if not rows:
        return []
    refs = sorted({r.pilot_reference for r in rows})
    status_of: dict[tuple[str, str], str] = {(vo, ref): status for vo, ref, status in
                                             session.execute(
        select(Pilot.vo, Pilot.reference, Pilot.status).where(Pilot.reference.in_(refs)))}
    return [_silent_job(r, status_of.get((r.vo, r.pilot_reference))) for r in rows]


def describe_silence(silence: timedelta) -> str:
    """A duration as a person reads it: "45 s", "31 min", "2 h 5 min"."""
    seconds = max(0, int(silence.total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def mark_stalled(session: Session, jobs: Sequence[SilentJob], *, now: datetime,
                 source: str = SOURCE) -> list[int]:
    """Move the given silent Matched or Running jobs to Stalled, the minor status saying how
    long they have been silent; return the ids moved. A job no longer in the status it was
    selected with is left alone (someone else handled it)."""
    groups: dict[tuple[JobStatus, str], list[int]] = defaultdict(list)
    for job in jobs:
        minor = f"No heartbeat for {describe_silence(job.silent_for(now))}"
        groups[(job.status, minor)].append(job.id)
    moved: list[int] = []
    for (status, minor), ids in sorted(groups.items()):
        try:
            apply_transition(session, ids, status, S.STALLED, minor_status=minor,
                             source=source, now=now)
            moved.extend(ids)
        except ConflictError:
            # Some changed under us: all or nothing failed, so each on its own.
            for job_id in ids:
                try:
                    apply_transition(session, [job_id], status, S.STALLED,
                                     minor_status=minor, source=source, now=now)
                    moved.append(job_id)
                except ConflictError:
                    pass
    return sorted(moved)


def reschedule_silent_job(session: Session, job: SilentJob, *, now: datetime, reason: str,
                          max_reschedules: int, count: bool = True,
                          source: str = SOURCE) -> JobStatus | None:
    """Reschedule one job selected as silent: Received (the caller runs the optimizer chain),
    or Failed once it was rescheduled ``max_reschedules`` times (``count`` false: back to the
    chain without that being an attempt). Returns the new status, or None when the job is no
    longer as it was selected (it spoke, or someone else handled it): then nothing changed."""
    savepoint = session.begin_nested()
    try:
        current = lock_job(session, job.id)
        if (current.status != job.status.value or current.heartbeat_at != job.heartbeat_at
                or current.pilot_reference != job.pilot_reference):
            savepoint.rollback()
            return None
        new = reschedule_job(session, job.id, by=source, now=now, reason=reason,
                             max_reschedules=max_reschedules, fail_when_exhausted=True,
                             count=count)
    except (ConflictError, IllegalTransitionError):
        savepoint.rollback()
        return None
    savepoint.commit()
    return new
