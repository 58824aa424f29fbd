"""Putting jobs into task queues and taking them out again (kill, reschedule, cleanup).

Locking protocol shared with taskqueue.matching.claim, which keeps "an inactive queue has no waiting
job" true under concurrency (and so every "no match" answer true): an inserter locks the rows of
the queues it fills (SELECT ... FOR UPDATE, in id order; for a single active queue, the UPDATE
that folds the new jobs into its statistics, guarded by ``active = 1``) before adding jobs, or in
the same statement as it adds them (PostgreSQL), and holds them until it commits; a claimer
marks a queue inactive only while it holds that row's lock and sees no job left. Either the
claimer waits its turn and then sees the new jobs, or it finds the row locked and leaves the flag
alone.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Float, Select, Table, bindparam, delete, exists, func, select, update
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.orm import Session

from taskqueue.core.definitions import JobRequirements, TaskQueueDefinition
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db.bulk import in_ids, insert_rows
from taskqueue.db.models import (
    Job,
    TaskQueue,
    TaskQueueBannedSite,
    TaskQueueCE,
    TaskQueueJob,
    TaskQueuePlatform,
    TaskQueueSite,
    TaskQueueTag,
    jobs_table,
    task_queues_table,
    tq_banned_sites_table,
    tq_ces_table,
    tq_jobs_table,
    tq_platforms_table,
    tq_sites_table,
    tq_tags_table,
)
from taskqueue.queues.jobs import apply_transition
from taskqueue.queues.newjobs import QueueRefill
from taskqueue.queues.shares import recompute_priorities, virtual_time

#: The minor status of a job waiting in its task queue.
WAITING_MINOR_STATUS = "Pilot Agent Submission"
#: Priority a queue has between its creation and the fair-share computation.
INITIAL_PRIORITY = 1.0

tq = task_queues_table.c


@dataclass(frozen=True)
class QueueEntry:
    """A job ready to wait in the task queue of its requirements."""

    job_id: int
    requirements: JobRequirements
    user_priority: int = 1


def enqueue_jobs(session: Session, entries: Sequence[QueueEntry], settings: Settings, *,
                 now: datetime, rng: random.Random | None = None,
                 from_status: JobStatus | None = JobStatus.CHECKING,
                 source: str = "optimizer") -> dict[int, int]:
    """Insert jobs into the task queues of their definitions, creating queues as needed, and
    move them to Waiting (``from_status`` None: they were stored Waiting). Returns job id →
    task-queue id.

    Queues created here get their fair-share priority at once; the priorities of their sibling
    queues are brought up to date by :func:`taskqueue.queues.shares.recompute_priorities`, which the
    cleanup, the operator and the priority agent run (an insert never rewrites a whole group).
    """
    if not entries:
        return {}
    plan = reserve_queues(session, [(e.requirements, e.user_priority) for e in entries],
                          settings, now=now, rng=rng)
    insert_rows(session.connection(), tq_jobs_table, [
        {"job_id": e.job_id, "tq_id": tq_id, "rank": -e.user_priority}
        for e, tq_id in zip(entries, plan.queue_ids, strict=True)
    ])
    if from_status is not None:
        apply_transition(session, [e.job_id for e in entries], from_status, JobStatus.WAITING,
                         minor_status=WAITING_MINOR_STATUS, source=source, now=now)
    by_pool: dict[str, list[int]] = {}
    for e in entries:
        if e.requirements.submit_pool is not None:
            by_pool.setdefault(e.requirements.submit_pool, []).append(e.job_id)
    dialect = session.get_bind().dialect.name
    for pool, pool_jobs in by_pool.items():  # a job's pool is its queue's pool
        session.connection().execute(
            update(jobs_table).where(in_ids(jobs_table.c.id, pool_jobs, dialect))
            .values(submit_pool=pool))
    finish_queues(session, settings, plan)
    return {e.job_id: tq_id for e, tq_id in zip(entries, plan.queue_ids, strict=True)}


@dataclass(frozen=True)
class QueuePlan:
    """The queues jobs about to be inserted go to, locked and with the jobs counted in their
    statistics (:func:`reserve_queues`); the jobs' ``task_queue_jobs`` rows are the caller's
    to write, then :func:`finish_queues`."""

    #: The queue of each job, in the order given.
    queue_ids: list[int]
    batch: dict[str, _Batch]
    ids: dict[str, int]
    created: list[str]


def reserve_queues(session: Session, jobs: Sequence[tuple[JobRequirements, int]],
                   settings: Settings, *, now: datetime, rng: random.Random | None = None
                   ) -> QueuePlan:
    """Get, lock (until commit), activate or create the queues of ``jobs`` ((requirements,
    user priority) pairs) and fold the jobs into their statistics, before the jobs themselves
    are written: a submission can then store its jobs, their history and their queue rows in
    one statement."""
    digests, batch = plan_queues(jobs, settings)
    return lock_planned(session, digests, batch, now=now, rng=rng)


def plan_queues(jobs: Sequence[tuple[JobRequirements, int]], settings: Settings
                ) -> tuple[list[str], dict[str, _Batch]]:
    """The digest of each job's queue, and the jobs each queue gets (nothing read or locked)."""
    digests: list[str] = []
    batch: dict[str, _Batch] = {}
    known: dict[JobRequirements, str] = {}
    definitions: dict[TaskQueueDefinition, str] = {}
    for requirements, priority in jobs:
        digest = known.get(requirements)
        if digest is None:
            d = TaskQueueDefinition.for_job(requirements, settings)
            digest = definitions.get(d) or definitions.setdefault(d, d.digest())
            known[requirements] = digest
            batch.setdefault(digest, _Batch(d))
        digests.append(digest)
        batch[digest].add(priority)
    return digests, batch


def lock_planned(session: Session, digests: list[str], batch: dict[str, _Batch], *,
                 now: datetime, rng: random.Random | None = None) -> QueuePlan:
    """:func:`reserve_queues` for jobs already planned with :func:`plan_queues`."""
    tq_ids, created = _lock_queues(session, batch, now, rng or random.Random())
    return QueuePlan([tq_ids[d] for d in digests], batch, tq_ids, created)


def refill_of(batch: dict[str, _Batch]) -> QueueRefill | None:
    """The refill of a batch that goes to one queue, or None."""
    if len(batch) != 1:
        return None
    ((digest, b),) = batch.items()
    return QueueRefill(digest, b.count, b.priority_sum)


def finish_queues(session: Session, settings: Settings, plan: QueuePlan) -> None:
    """Give the queues the plan created their fair-share priority."""
    if plan.created:
        recompute_priorities(session, settings, {(plan.batch[d].definition.vo,
                                                  plan.batch[d].definition.owner_group)
                                                 for d in plan.created},
                             only={plan.ids[d] for d in plan.created})


@dataclass
class _Batch:
    """The jobs of one insertion that go to one queue."""

    definition: TaskQueueDefinition
    count: int = 0
    priority_sum: int = 0

    def add(self, user_priority: int) -> None:
        self.count += 1
        self.priority_sum += user_priority


def _lock_queues(session: Session, batch: dict[str, _Batch], now: datetime,
                 rng: random.Random) -> tuple[dict[str, int], list[str]]:
    """Get or create the queues of ``batch``, lock their rows until commit, activate them and
    fold the batch into their job statistics. Returns digest → id and the digests created."""
    conn = session.connection()
    ids: dict[str, int] = {}
    created: list[str] = []
    pending = set(batch)
    if len(pending) == 1:
        # The usual case, one queue already active: its row is locked and its statistics
        # folded in by one UPDATE (the arithmetic below, in the same order, in SQL).
        (digest,) = pending
        b = batch[digest]
        params = {"b_digest": digest, "b_count": b.count, "b_sum": b.priority_sum}
        if conn.dialect.name == "mysql":
            # No UPDATE ... RETURNING: the id comes back as the statement's insert id.
            result = conn.execute(_REFILL_ACTIVE_MYSQL, params)
            if result.rowcount == 1 and result.lastrowid:
                return {digest: int(result.lastrowid)}, []
        else:
            found = conn.execute(_REFILL_ACTIVE, params).scalar_one_or_none()
            if found is not None:
                return {digest: found}, []
    while pending:
        # Rows are locked in id order, as every inserter does, to keep deadlocks rare.
        rows = conn.execute(
            select(tq.id, tq.digest, tq.vo, tq.active, tq.draw_key, tq.priority,
                   tq.mean_job_priority, tq.jobs_inserted)
            .where(tq.digest.in_(sorted(pending))).order_by(tq.id).with_for_update()
        ).all()
        changes = []
        clocks: dict[str, float] = {}
        for row in rows:
            b = batch[row.digest]
            if row.active:
                n = row.jobs_inserted + b.count
                mean = (row.mean_job_priority * row.jobs_inserted + b.priority_sum) / n
                key, clock = row.draw_key, None
            else:
                # A queue coming back starts afresh: its clock from now, its statistics from
                # the jobs it holds now.
                if row.vo not in clocks:
                    clocks[row.vo] = virtual_time(session, row.vo)
                n, mean = b.count, b.priority_sum / b.count
                clock = clocks[row.vo]
                key = max(row.draw_key, clock) + rng.expovariate(row.priority)
            changes.append({"b_id": row.id, "b_mean": mean, "b_n": n, "b_key": key,
                            "b_clock": clock})
            ids[row.digest] = row.id
        if changes:
            conn.execute(_REFILL, changes)
        missing = pending - {row.digest for row in rows}
        # Queues that do not exist (or were deleted by the cleanup since): create them. A
        # digest another inserter creates at the same moment is picked up on the next round.
        made = _create_queues(session, [batch[d] for d in sorted(missing)], now, rng)
        ids.update(made)
        created.extend(made)
        pending = missing - set(made)
    return ids, created


_REFILL = (
    update(task_queues_table).where(tq.id == bindparam("b_id"))
    .values(mean_job_priority=bindparam("b_mean"), jobs_inserted=bindparam("b_n"),
            draw_key=bindparam("b_key"),
            draw_clock=func.coalesce(bindparam("b_clock", type_=Float), tq.draw_clock),
            active=1, emptied_at=None)
)

_REFILL_MEAN = ((tq.mean_job_priority * tq.jobs_inserted + bindparam("b_sum", type_=Float))
                / (tq.jobs_inserted + bindparam("b_count")))
_REFILL_ACTIVE = (
    update(task_queues_table).where(tq.digest == bindparam("b_digest"), tq.active == 1)
    .values(mean_job_priority=_REFILL_MEAN,
            jobs_inserted=tq.jobs_inserted + bindparam("b_count"), emptied_at=None)
    .returning(tq.id)
)
#: MariaDB: LAST_INSERT_ID(id) makes the row's id the insert id the server answers with. It
#: assigns left to right, each assignment seeing the ones before: the mean goes first, while
#: jobs_inserted still holds the old count.
_REFILL_ACTIVE_MYSQL = (
    update(task_queues_table).where(tq.digest == bindparam("b_digest"), tq.active == 1)
    .ordered_values((tq.mean_job_priority, _REFILL_MEAN),
                    (tq.jobs_inserted, tq.jobs_inserted + bindparam("b_count")),
                    (tq.emptied_at, None), (tq.id, func.last_insert_id(tq.id)))
)

#: Queues created per INSERT statement (keeps SQLite under its bound-parameter limit).
_CREATE_CHUNK = 500


def _create_queues(session: Session, batches: list[_Batch], now: datetime,
                   rng: random.Random) -> dict[str, int]:
    """Insert the queues unless concurrent inserters did; return digest → id of those made here.

    A new queue's clock starts at the VO's current time, at the provisional rate
    INITIAL_PRIORITY; the fair-share computation that follows rescales it to the real one.
    """
    made: dict[str, int] = {}
    if not batches:
        return made
    conn = session.connection()
    clocks: dict[str, float] = {}
    for vo in {b.definition.vo for b in batches}:
        clocks[vo] = virtual_time(session, vo)
    for start in range(0, len(batches), _CREATE_CHUNK):
        chunk = batches[start:start + _CREATE_CHUNK]
        rows = [_queue_row(b, now, clocks[b.definition.vo],
                           clocks[b.definition.vo] + rng.expovariate(INITIAL_PRIORITY))
                for b in chunk]
        # RETURNING yields the rows this statement inserted, and only those (row counts are
        # not reliable for this: PostgreSQL reports -1 for an INSERT with RETURNING).
        made.update({digest: tq_id for tq_id, digest in conn.execute(
            _insert_if_absent(conn.dialect.name, rows).returning(tq.id, tq.digest))})
    values: dict[Table, list[dict[str, object]]] = {}
    for b in batches:
        if b.definition.digest() not in made:
            continue
        tq_id = made[b.definition.digest()]
        d = b.definition
        for table, vals in ((tq_sites_table, d.sites), (tq_banned_sites_table, d.banned_sites),
                            (tq_platforms_table, d.platforms), (tq_tags_table, d.tags),
                            (tq_ces_table, d.ces)):
            values.setdefault(table, []).extend({"tq_id": tq_id, "value": v}
                                                for v in sorted(vals))
    for table, value_rows in values.items():
        insert_rows(conn, table, value_rows)
    return made


def _queue_row(b: _Batch, now: datetime, clock: float, key: float) -> dict[str, object]:
    d = b.definition
    return {
        "digest": d.digest(), "vo": d.vo, "owner_group": d.owner_group, "owner": d.owner,
        "cpu_time": d.cpu_time, "processors": d.processors, "memory": d.memory,
        "gpus": d.gpus, "job_type": d.job_type, "submit_pool": d.submit_pool,
        "expression": d.expression,
        "priority": INITIAL_PRIORITY,
        "mean_job_priority": b.priority_sum / b.count, "jobs_inserted": b.count,
        "active": 1, "draw_key": key, "draw_clock": clock, "created_at": now,
        "emptied_at": None,
    }


def _insert_if_absent(dialect: str, rows: list[dict[str, object]]
                      ) -> postgresql.Insert | sqlite.Insert | mysql.Insert:
    if dialect == "postgresql":
        return postgresql.insert(task_queues_table).values(rows).on_conflict_do_nothing(
            index_elements=["digest"])
    if dialect == "sqlite":
        return sqlite.insert(task_queues_table).values(rows).on_conflict_do_nothing(
            index_elements=["digest"])
    return mysql.insert(task_queues_table).values(rows).prefix_with("IGNORE")


def remove_jobs_from_queues(session: Session, job_ids: Sequence[int], *,
                            now: datetime | None = None) -> int:
    """Take jobs out of their task queues (kill, reschedule, delete); return how many were in
    one. With ``now``, a queue this empties is marked inactive at once (under its row lock, as
    a claimer would), so that no match looks at it again; the cleanup drops it after its grace
    period. A queue another transaction holds is left to the next claim or cleanup."""
    if not job_ids:
        return 0
    dialect = session.get_bind().dialect.name
    queues: list[int] = []
    if now is not None:
        queues = list(session.scalars(
            select(tq_jobs_table.c.tq_id).where(in_ids(tq_jobs_table.c.job_id, job_ids, dialect))
            .distinct()))
    result = session.connection().execute(
        delete(tq_jobs_table).where(in_ids(tq_jobs_table.c.job_id, job_ids, dialect)))
    if queues and now is not None:
        _mark_empty(session, select(TaskQueue.id).where(TaskQueue.id.in_(queues),
                                                        TaskQueue.active == 1), now)
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


def waiting_definition(session: Session, job_id: int) -> TaskQueueDefinition | None:
    """The definition of the task queue the job waits in, or None if it waits in none."""
    tq = session.execute(
        select(TaskQueue).join(TaskQueueJob, TaskQueueJob.tq_id == TaskQueue.id)
        .where(TaskQueueJob.job_id == job_id)).scalar_one_or_none()
    if tq is None:
        return None

    def values(table: Any) -> frozenset[str]:
        return frozenset(session.scalars(select(table.value).where(table.tq_id == tq.id)))

    return TaskQueueDefinition(
        vo=tq.vo, owner_group=tq.owner_group, owner=tq.owner, cpu_time=tq.cpu_time,
        processors=tq.processors, memory=tq.memory, job_type=tq.job_type,
        submit_pool=tq.submit_pool, expression=tq.expression,
        sites=values(TaskQueueSite), banned_sites=values(TaskQueueBannedSite),
        platforms=values(TaskQueuePlatform), tags=values(TaskQueueTag), ces=values(TaskQueueCE),
        gpus=tq.gpus)


@dataclass(frozen=True)
class QueueInfo:
    """A task queue as listings show it."""

    queue: TaskQueue
    waiting: int
    values: dict[str, list[str]]


def queue_page(session: Session, vo: str, *, after: int = 0, limit: int = 100,
               owner_group: str | None = None, job_type: str | None = None,
               ids: Sequence[int] | None = None) -> list[QueueInfo]:
    """A page of the VO's task queues by ascending id (of ``ids`` only, when given), with
    their waiting jobs and their sites, banned sites, platforms and tags."""
    stmt = select(TaskQueue).where(TaskQueue.vo == vo, TaskQueue.id > after)
    for column, value in ((TaskQueue.owner_group, owner_group),
                          (TaskQueue.job_type, job_type)):
        if value is not None:
            stmt = stmt.where(column == value)
    if ids is not None:
        stmt = stmt.where(TaskQueue.id.in_(list(ids)))
    queues = list(session.scalars(stmt.order_by(TaskQueue.id).limit(limit)))
    ids = [q.id for q in queues]
    if not ids:
        return []
    waiting = dict(session.execute(
        select(TaskQueueJob.tq_id, func.count()).where(TaskQueueJob.tq_id.in_(ids))
        .group_by(TaskQueueJob.tq_id)).all())
    values: dict[int, dict[str, list[str]]] = {i: {} for i in ids}
    for label, table in (("sites", TaskQueueSite), ("banned_sites", TaskQueueBannedSite),
                         ("platforms", TaskQueuePlatform), ("tags", TaskQueueTag),
                         ("ces", TaskQueueCE)):
        for tq_id, value in session.execute(
                select(table.tq_id, table.value).where(table.tq_id.in_(ids))
                .order_by(table.tq_id, table.value)):
            values[tq_id].setdefault(label, []).append(value)
    return [QueueInfo(q, waiting.get(q.id, 0), values[q.id]) for q in queues]


@dataclass(frozen=True)
class WaitingCount:
    tq_id: int
    vo: str
    owner_group: str
    job_type: str
    waiting: int


def waiting_counts(session: Session, *, largest: int) -> list[WaitingCount]:
    """The ``largest`` task queues by waiting jobs, with their counts."""
    n = func.count().label("n")
    rows = session.execute(
        select(TaskQueue.id, TaskQueue.vo, TaskQueue.owner_group, TaskQueue.job_type, n)
        .join(TaskQueueJob, TaskQueueJob.tq_id == TaskQueue.id)
        .group_by(TaskQueue.id, TaskQueue.vo, TaskQueue.owner_group, TaskQueue.job_type)
        .order_by(n.desc(), TaskQueue.id).limit(largest))
    return [WaitingCount(r.id, r.vo, r.owner_group, r.job_type, r.n) for r in rows]


def task_queue_of(session: Session, job_id: int) -> int | None:
    """The id of the task queue the job waits in, or None."""
    return session.scalar(select(TaskQueueJob.tq_id).where(TaskQueueJob.job_id == job_id))


def next_jobs(session: Session, tq_id: int, *, limit: int) -> list[Job]:
    """The queue's first ``limit`` jobs, in the order its pilots get them."""
    return list(session.scalars(
        select(Job).join(TaskQueueJob, TaskQueueJob.job_id == Job.id)
        .where(TaskQueueJob.tq_id == tq_id)
        .order_by(TaskQueueJob.rank, TaskQueueJob.job_id).limit(limit)))
