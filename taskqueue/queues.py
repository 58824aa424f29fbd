"""Putting jobs into task queues and taking them out again (kill, reschedule, cleanup).

Locking protocol shared with taskqueue.matching, which keeps "a queue marked inactive has no
waiting job" true under concurrency: whoever adds jobs to a queue updates the queue's row in the
same transaction (after the jobs), and a claimer marks a queue inactive only while it holds that
row's lock and sees no job left. Either the inserter waits for the claimer and re-activates the
queue, or the claimer finds the row locked and leaves the flag alone.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Select, delete, exists, insert, select, update
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.orm import Session

from taskqueue.definitions import JobRequirements, TaskQueueDefinition
from taskqueue.jobs import apply_transition
from taskqueue.models import (
    TaskQueue,
    TaskQueueBannedSite,
    TaskQueueJob,
    TaskQueuePlatform,
    TaskQueueSite,
    TaskQueueTag,
    task_queues_table,
    tq_jobs_table,
)
from taskqueue.settings import Settings
from taskqueue.shares import recompute_priorities, virtual_time
from taskqueue.states import JobStatus

#: Priority a queue has between its creation and the fair-share recomputation.
INITIAL_PRIORITY = 1.0


@dataclass(frozen=True)
class QueueEntry:
    """A job ready to wait in the task queue of its requirements."""

    job_id: int
    requirements: JobRequirements
    user_priority: int = 1


def enqueue_jobs(session: Session, entries: Sequence[QueueEntry], settings: Settings, *,
                 now: datetime, rng: random.Random | None = None,
                 from_status: JobStatus = JobStatus.CHECKING,
                 source: str = "optimizer") -> dict[int, int]:
    """Insert jobs into the task queues of their definitions, creating queues as needed, and
    move them to Waiting. Returns job id → task-queue id."""
    if not entries:
        return {}
    rng = rng or random.Random()
    definitions = {e.job_id: TaskQueueDefinition.for_job(e.requirements, settings)
                   for e in entries}
    by_digest = {d.digest(): d for d in definitions.values()}
    tq_ids, created = _activate_queues(session, by_digest, now, rng)
    session.execute(
        insert(TaskQueueJob),
        [{"job_id": e.job_id, "tq_id": tq_ids[definitions[e.job_id].digest()],
          "rank": -e.user_priority} for e in entries],
    )
    apply_transition(session, [e.job_id for e in entries], from_status, JobStatus.WAITING,
                     minor_status="Pilot Agent Submission", source=source, now=now)
    if created:
        recompute_priorities(session, settings, {(d.vo, d.owner_group) for d in created})
    return {e.job_id: tq_ids[definitions[e.job_id].digest()] for e in entries}


def _activate_queues(session: Session, by_digest: dict[str, TaskQueueDefinition],
                     now: datetime, rng: random.Random
                     ) -> tuple[dict[str, int], list[TaskQueueDefinition]]:
    """Get or create the queues of ``by_digest`` and lock and activate each of them."""
    ids: dict[str, int] = {}
    created: list[TaskQueueDefinition] = []
    pending = dict(by_digest)
    while pending:
        found: dict[str, int] = {
            digest: tq_id for digest, tq_id in session.execute(
                select(TaskQueue.digest, TaskQueue.id).where(TaskQueue.digest.in_(pending)))
        }
        for digest, definition in pending.items():
            if digest not in found:
                tq_id, was_created = _create_queue(session, definition, now, rng)
                found[digest] = tq_id
                if was_created:
                    created.append(definition)
        retry: dict[str, TaskQueueDefinition] = {}
        # Sorted by id: concurrent inserters lock queue rows in the same order.
        for digest, tq_id in sorted(found.items(), key=lambda kv: kv[1]):
            if _activate_queue(session, tq_id, pending[digest].vo, now, rng):
                ids[digest] = tq_id
            else:  # deleted by the cleanup between our read and our lock: create it again
                retry[digest] = pending[digest]
        pending = retry
    return ids, created


def _activate_queue(session: Session, tq_id: int, vo: str, now: datetime,
                    rng: random.Random) -> bool:
    row = session.execute(
        select(TaskQueue.active, TaskQueue.draw_key, TaskQueue.priority)
        .where(TaskQueue.id == tq_id).with_for_update()
    ).one_or_none()
    if row is None:
        return False
    values: dict[str, object] = {"active": 1, "emptied_at": None}
    if not row.active:
        # A queue coming back starts its clock from now, not from where it stopped.
        values["draw_key"] = max(row.draw_key, virtual_time(session, vo)) + rng.expovariate(
            row.priority)
    session.execute(update(TaskQueue).where(TaskQueue.id == tq_id).values(**values))
    return True


def _create_queue(session: Session, d: TaskQueueDefinition, now: datetime,
                  rng: random.Random) -> tuple[int, bool]:
    """Insert the queue unless a concurrent inserter did; return its id and whether we made it."""
    digest = d.digest()
    values = {
        "digest": digest, "vo": d.vo, "owner_group": d.owner_group, "owner": d.owner,
        "cpu_time": d.cpu_time, "processors": d.processors, "memory": d.memory,
        "job_type": d.job_type, "submit_pool": d.submit_pool, "priority": INITIAL_PRIORITY,
        "active": 1, "created_at": now, "emptied_at": None,
        "draw_key": virtual_time(session, d.vo) + rng.expovariate(INITIAL_PRIORITY),
    }
    dialect = session.get_bind().dialect.name
    stmt: postgresql.Insert | sqlite.Insert | mysql.Insert
    if dialect == "postgresql":
        stmt = postgresql.insert(task_queues_table).values(values).on_conflict_do_nothing(
            index_elements=["digest"])
    elif dialect == "sqlite":
        stmt = sqlite.insert(task_queues_table).values(values).on_conflict_do_nothing(
            index_elements=["digest"])
    else:
        stmt = mysql.insert(task_queues_table).values(values).prefix_with("IGNORE")
    # RETURNING yields a row only when this statement inserted it (the row count is not
    # reliable here: PostgreSQL reports -1 for an INSERT with RETURNING).
    inserted = session.connection().execute(
        stmt.returning(task_queues_table.c.id)).scalar_one_or_none()
    was_created = inserted is not None
    tq_id = inserted if inserted is not None else session.execute(
        select(TaskQueue.id).where(TaskQueue.digest == digest)).scalar_one()
    if was_created:
        for table, vals in ((TaskQueueSite, d.sites), (TaskQueueBannedSite, d.banned_sites),
                            (TaskQueuePlatform, d.platforms), (TaskQueueTag, d.tags)):
            if vals:
                session.execute(insert(table), [{"tq_id": tq_id, "value": v}
                                                for v in sorted(vals)])
    return tq_id, was_created


def remove_jobs_from_queues(session: Session, job_ids: Sequence[int]) -> int:
    """Take jobs out of their task queues (kill, reschedule, delete); return how many were in
    one. The queue rows stay; an emptied queue is found and dropped by the cleanup."""
    if not job_ids:
        return 0
    result = session.connection().execute(
        delete(tq_jobs_table).where(tq_jobs_table.c.job_id.in_(job_ids)))
    return result.rowcount


def delete_empty_queues(session: Session, settings: Settings, *, now: datetime,
                        grace: timedelta | None = None) -> list[int]:
    """Delete queues that hold no job and have been empty for longer than the grace period.

    Queues locked by an inserter or a claimer are left for the next round. Returns the ids.
    """
    grace = grace if grace is not None else timedelta(
        seconds=settings.taskqueue.empty_queue_grace)
    has_jobs = exists().where(TaskQueueJob.tq_id == TaskQueue.id)
    # A queue emptied by kill/reschedule is still flagged active: mark it inactive first, under
    # its lock, so that its grace period starts now.
    _mark_empty(session, select(TaskQueue.id).where(TaskQueue.active == 1, ~has_jobs), now)
    cutoff = now - grace
    doomed = list(session.scalars(
        select(TaskQueue.id)
        .where(TaskQueue.active == 0, TaskQueue.emptied_at <= cutoff, ~has_jobs)
        .order_by(TaskQueue.id)
        .with_for_update(skip_locked=True)
    ))
    if doomed:
        # Groups whose queues vanish get their shares split anew.
        groups = {(vo, group) for vo, group in session.execute(
            select(TaskQueue.vo, TaskQueue.owner_group).where(TaskQueue.id.in_(doomed))
            .distinct())}
        session.execute(delete(TaskQueue).where(TaskQueue.id.in_(doomed), ~has_jobs)
                        .execution_options(synchronize_session=False))
        recompute_priorities(session, settings, groups)
    return doomed


def _mark_empty(session: Session, candidates: Select[int], now: datetime) -> None:
    ids = list(session.scalars(candidates.order_by(TaskQueue.id)
                               .with_for_update(skip_locked=True)))
    if ids:
        session.execute(
            update(TaskQueue)
            .where(TaskQueue.id.in_(ids), ~exists().where(TaskQueueJob.tq_id == TaskQueue.id))
            .values(active=0, emptied_at=now)
            .execution_options(synchronize_session=False)
        )
