"""The purge of ended jobs (DIRAC's JobCleaningAgent): a job that ended longer ago than its
status's retention is removed with its status history, its task-queue row, the pilots' notes
that they ran it (``pilot_runs``) and its sandbox references (their foreign key cascades), and
counted in ``purged_jobs``. The dashboard's job
counts keep their totals: deleting a job changes no count (taskqueue.db.jobcounts).

One call removes one batch, in the caller's transaction, which should hold nothing else: the
batch's jobs are locked with SKIP LOCKED, so a job that a change in progress holds (a
reschedule, a kill) is left for a later batch, and the purge never waits for a lock; nothing a
claim reads or locks (waiting jobs, their queue rows) is touched. The delete repeats the
status and the end time as a guard, so that on SQLite, which has no row locks, a job whose
status changed since it was read stays.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from taskqueue.core.states import FINAL_STATES
from taskqueue.db.models import (
    JobSandbox,
    history_table,
    job_payloads_table,
    jobs_table,
    pilot_runs_table,
    purged_jobs_table,
    tq_jobs_table,
)


@dataclass(frozen=True)
class PurgedBatch:
    #: Jobs removed, per VO.
    by_vo: dict[str, int]
    #: Jobs found ended long enough (some may have been skipped as changed meanwhile).
    candidates: int
    #: Sandboxes the removed jobs referenced (they may now be referenced by no job).
    sandboxes: list[str]

    @property
    def jobs(self) -> int:
        return sum(self.by_vo.values())


def purge_batch(session: Session, *, status: str, before: datetime, limit: int) -> PurgedBatch:
    """Remove up to ``limit`` jobs in ``status`` (a final one) that ended before ``before``,
    oldest id first, with what belongs to them."""
    if status not in {s.value for s in FINAL_STATES}:
        raise ValueError(f"only ended jobs are purged, not {status!r} ones")
    j = jobs_table.c
    # A job killed or deleted before it ran may have no end time: its submission counts.
    ended = func.coalesce(j.ended_at, j.submitted_at)
    rows = session.execute(
        select(j.id, j.vo).where(j.status == status, ended < before)
        .order_by(j.id).limit(limit).with_for_update(skip_locked=True)).all()
    if not rows:
        return PurgedBatch({}, 0, [])
    ids = [row.id for row in rows]
    sandboxes = sorted(set(session.scalars(
        select(JobSandbox.sandbox_id).where(JobSandbox.job_id.in_(ids)))))
    session.execute(delete(jobs_table).where(j.id.in_(ids), j.status == status, ended < before))
    left = set(session.scalars(select(j.id).where(j.id.in_(ids))))
    gone = [i for i in ids if i not in left]
    if gone:
        session.execute(delete(history_table).where(history_table.c.job_id.in_(gone)))
        session.execute(delete(tq_jobs_table).where(tq_jobs_table.c.job_id.in_(gone)))
        session.execute(delete(pilot_runs_table).where(pilot_runs_table.c.job_id.in_(gone)))
        session.execute(delete(job_payloads_table).where(
            job_payloads_table.c.job_id.in_(gone)))
    by_vo = Counter(row.vo for row in rows if row.id not in left)
    for vo, n in sorted(by_vo.items()):
        _count_purged(session, vo, status, n)
    return PurgedBatch(dict(by_vo), len(ids), sandboxes)


def _count_purged(session: Session, vo: str, status: str, n: int) -> None:
    p = purged_jobs_table.c
    counted: int = session.connection().execute(
        update(purged_jobs_table).where(p.vo == vo, p.status == status)
        .values(jobs=p.jobs + n)).rowcount
    if not counted:
        session.execute(insert(purged_jobs_table).values(vo=vo, status=status, jobs=n))


def purged_counts(session: Session) -> dict[tuple[str, str], int]:
    """Jobs purged so far, per (VO, status)."""
    p = purged_jobs_table.c
    return {(vo, status): int(n) for vo, status, n in
            session.execute(select(p.vo, p.status, p.jobs))}
