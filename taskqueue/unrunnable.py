"""Waiting jobs that no configured queue can run: their minor status says so, instead of the
"Pilot Agent Submission" that nothing will ever follow, and, when the operator chose so
(``[agents] unrunnable_timeout``), they fail after that long.

Which task queues some configured queue can serve is the caller's to say (optimizers.outlook:
the resource description each queue's pilots present, matched as the matcher matches). A job
whose queue becomes runnable again (the resources file changed) gets its usual minor status
back.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from taskqueue.bulk import in_ids
from taskqueue.jobs import apply_transition, record_minor_status
from taskqueue.models import Job, history_table, tq_jobs_table
from taskqueue.queues import WAITING_MINOR_STATUS, remove_jobs_from_queues
from taskqueue.states import JobStatus

S = JobStatus
#: The minor status of a Waiting job that no configured queue can run.
NO_QUEUE_MINOR_STATUS = "No configured queue can run it (see explain)"
SOURCE = "watchdog"
JOB_ID = Job.__table__.c.id


@dataclass(frozen=True)
class UnrunnableOutcome:
    flagged: int
    cleared: int
    failed: int

    def line(self) -> str:
        return (f"{self.flagged} waiting jobs no queue can run, {self.cleared} runnable again, "
                f"{self.failed} failed for it")


def _lock_waiting(session: Session, ids: list[int], minor: str) -> list[int]:
    """Those of ``ids`` still Waiting with ``minor``, locked (others' locks skipped)."""
    if not ids:
        return []
    dialect = session.get_bind().dialect.name
    return list(session.scalars(
        select(Job.id).where(in_ids(JOB_ID, ids, dialect), Job.status == S.WAITING.value,
                             Job.minor_status == minor)
        .order_by(Job.id).with_for_update(skip_locked=True)))


def _set_minor(session: Session, ids: list[int], minor: str, now: datetime) -> None:
    if not ids:
        return
    dialect = session.get_bind().dialect.name
    session.execute(update(Job).where(in_ids(JOB_ID, ids, dialect)).values(minor_status=minor)
                    .execution_options(synchronize_session=False))
    for job_id in ids:
        record_minor_status(session, job_id, S.WAITING, minor, source=SOURCE, now=now)


def mark_unrunnable(session: Session, runnable: Set[int], *, now: datetime,
                    fail_after: int) -> UnrunnableOutcome:
    """Give the Waiting jobs of task queues not in ``runnable`` the minor status that says no
    queue can run them, give those of runnable ones their usual minor status back, and, with
    ``fail_after`` > 0, fail those flagged for longer than that many seconds."""
    dialect = session.get_bind().dialect.name
    tqj = tq_jobs_table.c
    with_jobs = {int(i) for i in session.scalars(select(tqj.tq_id).distinct())}
    stuck_queues = sorted(with_jobs - set(runnable))
    stuck = sorted(int(i) for i in session.scalars(
        select(tqj.job_id).where(in_ids(tqj.tq_id, stuck_queues, dialect)))) \
        if stuck_queues else []
    flagged_now = set(session.scalars(select(Job.id).where(
        Job.status == S.WAITING.value, Job.minor_status == NO_QUEUE_MINOR_STATUS)))
    stuck_set = set(stuck)
    to_flag = _lock_waiting(session, [j for j in stuck if j not in flagged_now],
                            WAITING_MINOR_STATUS)
    _set_minor(session, to_flag, NO_QUEUE_MINOR_STATUS, now)
    to_clear = _lock_waiting(session, sorted(flagged_now - stuck_set), NO_QUEUE_MINOR_STATUS)
    _set_minor(session, to_clear, WAITING_MINOR_STATUS, now)
    failed: list[int] = []
    candidates = sorted(flagged_now & stuck_set)
    if fail_after > 0 and candidates:
        h = history_table.c
        since = (select(h.job_id, func.max(h.at).label("at"))
                 .where(in_ids(h.job_id, candidates, dialect),
                        h.minor_status == NO_QUEUE_MINOR_STATUS).group_by(h.job_id))
        old = [int(job_id) for job_id, at in session.execute(since)
               if at <= now - timedelta(seconds=fail_after)]
        failed = _lock_waiting(session, sorted(old), NO_QUEUE_MINOR_STATUS)
        if failed:
            remove_jobs_from_queues(session, failed, now=now)
            apply_transition(session, failed, S.WAITING, S.FAILED,
                             minor_status=f"No configured queue could run it within "
                                          f"{fail_after} s", source=SOURCE, now=now,
                             values={"ended_at": now})
    return UnrunnableOutcome(len(to_flag), len(to_clear), len(failed))
