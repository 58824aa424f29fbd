"""Waiting jobs that no configured queue can run: their minor status says so, instead of the
"Pilot Agent Submission" that nothing will ever follow, and, when the operator chose so
(``[agents] unrunnable_timeout``), they fail after that long. Those that only queues without
an ``Executor`` could run (pilots started by others may still come) are said so too.

Which task queues some configured queue can serve is the caller's to say (optimizers.outlook:
the resource description each queue's pilots present, matched as the matcher matches). A job
whose queue becomes runnable again (the resources file changed) gets its usual minor status
back.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, func, literal, or_, select, update
from sqlalchemy.orm import Session

from taskqueue.core.states import NO_DIRECTOR_MINOR_STATUS, NO_QUEUE_MINOR_STATUS, JobStatus
from taskqueue.db.bulk import in_ids
from taskqueue.db.models import Job, TaskQueue, history_table, tq_jobs_table
from taskqueue.queues.jobs import apply_transition, record_minor_status
from taskqueue.queues.taskqueues import WAITING_MINOR_STATUS, remove_jobs_from_queues

S = JobStatus
SOURCE = "watchdog"
JOB_ID = Job.__table__.c.id
#: The minor statuses of a Waiting job this module moves between.
UNRUNNABLE_MINOR_STATUSES = frozenset({WAITING_MINOR_STATUS, NO_QUEUE_MINOR_STATUS,
                                       NO_DIRECTOR_MINOR_STATUS})


#: Jobs each kind of change takes per call: the watchdog calls again while any was full.
BATCH = 1000


@dataclass(frozen=True)
class UnrunnableOutcome:
    flagged: int
    cleared: int
    failed: int
    #: Some change took a full batch: more may be waiting for the next call.
    more: bool = False
    #: Waiting jobs that only queues without an Executor could run, newly said so.
    undirected: int = 0

    def line(self) -> str:
        return (f"{self.flagged} waiting jobs no queue can run, {self.undirected} no queue "
                f"with an Executor can run, {self.cleared} runnable again, "
                f"{self.failed} failed for it")

    def __add__(self, other: UnrunnableOutcome) -> UnrunnableOutcome:
        return UnrunnableOutcome(self.flagged + other.flagged, self.cleared + other.cleared,
                                 self.failed + other.failed, other.more,
                                 self.undirected + other.undirected)


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
    record_minor_status(session, ids, S.WAITING, minor, source=SOURCE, now=now)


def _waiting_with(minor: str, queue_rule: ColumnElement[bool] | None) -> Select[Any]:
    """The Waiting jobs with ``minor`` whose task queue meets ``queue_rule``, by queue row (the
    queue rows and the jobs joined in the database: nothing is read per job here)."""
    tqj = tq_jobs_table.c
    # The values written in the statement: a partial index on them (the flagged jobs, see
    # taskqueue.db.models) serves it in any plan, a prepared one included.
    stmt = (select(tqj.job_id).join(Job, tqj.job_id == JOB_ID)
            .where(Job.status == literal(S.WAITING.value, literal_execute=True),
                   Job.minor_status == literal(minor, literal_execute=True)))
    return stmt if queue_rule is None else stmt.where(queue_rule)


def _first(session: Session, stmt: Select[Any], limit: int) -> list[int]:
    """The first ``limit`` job ids of ``stmt``, by id."""
    return [int(i) for i in session.scalars(stmt.order_by(tq_jobs_table.c.job_id).limit(limit))]


def task_queue_ids(session: Session) -> set[int]:
    """Every task queue's id: read with the runnable ones, so that a queue made afterwards
    is not taken for one no configured queue can run."""
    return {int(i) for i in session.scalars(select(TaskQueue.id))}


def mark_unrunnable(session: Session, runnable: Set[int], *, now: datetime,
                    fail_after: int, limit: int = BATCH, known: Set[int] | None = None,
                    directed: Set[int] | None = None) -> UnrunnableOutcome:
    """Give the Waiting jobs of task queues not in ``runnable`` (of ``known``, when given;
    else of all) the minor status that says no queue can run them, those of runnable ones not
    in ``directed`` (that only queues without an Executor could run; default: all runnable
    are) the one that says no pilot is started for them, give the others their usual minor
    status back, and, with ``fail_after`` > 0, fail those no queue can run flagged for longer
    than that many seconds: at most ``limit`` jobs of each, ``more`` saying whether to call
    again."""
    dialect = session.get_bind().dialect.name
    tqj = tq_jobs_table.c
    queues = task_queue_ids(session) if known is None else known
    stuck_queues = sorted(set(queues) - set(runnable))
    in_stuck = in_ids(tqj.tq_id, stuck_queues, dialect) if stuck_queues else None
    undirected_queues = sorted((set(queues) & set(runnable)) - set(
        runnable if directed is None else directed))
    in_undirected = in_ids(tqj.tq_id, undirected_queues, dialect) \
        if undirected_queues else None
    elsewhere = [rule for rule in (in_stuck, in_undirected) if rule is not None]
    usual = ~or_(*elsewhere) if elsewhere else None
    moved: dict[str, list[int]] = {}
    for target, rule in ((NO_QUEUE_MINOR_STATUS, in_stuck),
                         (NO_DIRECTOR_MINOR_STATUS, in_undirected),
                         (WAITING_MINOR_STATUS, usual)):
        moved[target] = []
        if rule is None and target != WAITING_MINOR_STATUS:
            continue
        for source in UNRUNNABLE_MINOR_STATUSES - {target}:
            ids = _lock_waiting(session, _first(session, _waiting_with(source, rule), limit),
                                source)
            _set_minor(session, ids, target, now)
            moved[target] += ids
    to_flag, to_clear = moved[NO_QUEUE_MINOR_STATUS], moved[WAITING_MINOR_STATUS]
    undirected = moved[NO_DIRECTOR_MINOR_STATUS]
    failed: list[int] = []
    if fail_after > 0 and in_stuck is not None:
        h = history_table.c
        flagged = _waiting_with(NO_QUEUE_MINOR_STATUS, in_stuck)
        # Flagged last (the latest history row saying so) before the time allowed.
        since = (select(h.job_id).where(h.job_id.in_(flagged.scalar_subquery()),
                                        h.minor_status == NO_QUEUE_MINOR_STATUS)
                 .group_by(h.job_id)
                 .having(func.max(h.at) <= now - timedelta(seconds=fail_after))
                 .order_by(h.job_id).limit(limit))
        old = [int(job_id) for job_id in session.scalars(since)]
        failed = _lock_waiting(session, old, NO_QUEUE_MINOR_STATUS)
        if failed:
            remove_jobs_from_queues(session, failed, now=now)
            apply_transition(session, failed, S.WAITING, S.FAILED,
                             minor_status=f"No configured queue could run it within "
                                          f"{fail_after} s", source=SOURCE, now=now,
                             values={"ended_at": now})
    more = limit in (len(to_flag), len(to_clear), len(failed), len(undirected))
    return UnrunnableOutcome(len(to_flag), len(to_clear), len(failed), more, len(undirected))
