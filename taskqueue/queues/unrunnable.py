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
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
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
#: Queue rows each call reads (in job id order, from where the last one stopped).
WINDOW = 10 * BATCH
#: The kind of change that fails a job no queue could run for too long.
FAIL = "failed"


@dataclass(frozen=True)
class UnrunnableOutcome:
    flagged: int
    cleared: int
    failed: int
    #: Some change took a full batch: more may be waiting for the next call.
    more: bool = False
    #: Waiting jobs that only queues without an Executor could run, newly said so.
    undirected: int = 0
    #: The job id after which the next call resumes; 0: from the first.
    after: int = field(default=0, compare=False)

    def line(self) -> str:
        return (f"{self.flagged} waiting jobs no queue can run, {self.undirected} no queue "
                f"with an Executor can run, {self.cleared} runnable again, "
                f"{self.failed} failed for it")

    def __add__(self, other: UnrunnableOutcome) -> UnrunnableOutcome:
        return UnrunnableOutcome(self.flagged + other.flagged, self.cleared + other.cleared,
                                 self.failed + other.failed, other.more,
                                 self.undirected + other.undirected, other.after)


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


def task_queue_ids(session: Session) -> set[int]:
    """Every task queue's id: read with the runnable ones, so that a queue made afterwards
    is not taken for one no configured queue can run."""
    return {int(i) for i in session.scalars(select(TaskQueue.id))}


def _targets(queues: Set[int], runnable: Set[int], directed: Set[int] | None) -> dict[int, str]:
    """The minor status each of ``queues``' Waiting jobs should have."""
    return {q: NO_QUEUE_MINOR_STATUS if q not in runnable
            else NO_DIRECTOR_MINOR_STATUS if directed is not None and q not in directed
            else WAITING_MINOR_STATUS for q in queues}


def _old_flags(session: Session, ids: list[int], now: datetime, fail_after: int) -> set[int]:
    """Those of ``ids`` flagged last (the latest history row saying so) before the time
    allowed."""
    if not ids:
        return set()
    h = history_table.c
    dialect = session.get_bind().dialect.name
    return {int(job_id) for job_id in session.scalars(
        select(h.job_id).where(in_ids(h.job_id, ids, dialect),
                               h.minor_status == NO_QUEUE_MINOR_STATUS)
        .group_by(h.job_id)
        .having(func.max(h.at) <= now - timedelta(seconds=fail_after)))}


def mark_unrunnable(session: Session, runnable: Set[int], *, now: datetime,
                    fail_after: int, limit: int = BATCH, known: Set[int] | None = None,
                    directed: Set[int] | None = None, after: int = 0,
                    window: int | None = None) -> UnrunnableOutcome:
    """Give the Waiting jobs of task queues not in ``runnable`` (of ``known``, when given;
    else of all) the minor status that says no queue can run them, those of runnable ones not
    in ``directed`` (that only queues without an Executor could run; default: all runnable
    are) the one that says no pilot is started for them, give the others their usual minor
    status back, and, with ``fail_after`` > 0, fail those no queue can run flagged for longer
    than that many seconds.

    One call reads the next ``window`` (default ``WINDOW``) queue rows after the job id
    ``after``, in job id order, each job read by its primary key, and changes at most ``limit``
    jobs of each kind among them: what it costs does not grow with the number of jobs. The
    outcome's ``after`` is where the next call resumes (0 once the walk reached the last queue
    row), ``more`` whether to call again."""
    window = WINDOW if window is None else window
    target_of = _targets(task_queue_ids(session) if known is None else known, runnable,
                         directed)
    tqj = tq_jobs_table.c
    rows = (select(tqj.job_id, tqj.tq_id).where(tqj.job_id > after)
            .order_by(tqj.job_id).limit(window).subquery())
    seen = [(int(job_id), int(tq_id), status, minor) for job_id, tq_id, status, minor in
            session.execute(select(rows.c.job_id, rows.c.tq_id, Job.status, Job.minor_status)
                            .outerjoin(Job, rows.c.job_id == JOB_ID)
                            .order_by(rows.c.job_id))]
    waiting = [(job_id, target_of[tq_id], minor) for job_id, tq_id, status, minor in seen
               if status == S.WAITING.value and minor in UNRUNNABLE_MINOR_STATUSES
               and tq_id in target_of]
    old = _old_flags(session, [job_id for job_id, target, minor in waiting
                               if target == minor == NO_QUEUE_MINOR_STATUS],
                     now, fail_after) if fail_after > 0 else set()
    # What each job needs, in id order, until one kind of change is full: the next call
    # resumes at the first job left.
    plan: dict[str, dict[str, list[int]]] = {kind: {} for kind in (*UNRUNNABLE_MINOR_STATUSES,
                                                                    FAIL)}
    counts = dict.fromkeys(plan, 0)
    resume = seen[-1][0] if len(seen) == window else 0
    cut = False
    for job_id, target, minor in waiting:
        kind = FAIL if job_id in old else target
        if kind == minor:
            continue
        if counts[kind] == limit:
            resume, cut = job_id - 1, True
            break
        counts[kind] += 1
        plan[kind].setdefault(minor, []).append(job_id)
    moved: dict[str, int] = {}
    for target in UNRUNNABLE_MINOR_STATUSES:
        moved[target] = 0
        for source, ids in sorted(plan[target].items()):
            locked = _lock_waiting(session, ids, source)
            _set_minor(session, locked, target, now)
            moved[target] += len(locked)
    failed = _lock_waiting(session, plan[FAIL].get(NO_QUEUE_MINOR_STATUS, []),
                           NO_QUEUE_MINOR_STATUS)
    if failed:
        remove_jobs_from_queues(session, failed, now=now)
        apply_transition(session, failed, S.WAITING, S.FAILED,
                         minor_status=f"No configured queue could run it within "
                                      f"{fail_after} s", source=SOURCE, now=now,
                         values={"ended_at": now})
    return UnrunnableOutcome(moved[NO_QUEUE_MINOR_STATUS], moved[WAITING_MINOR_STATUS],
                             len(failed), cut or resume != 0 or limit in counts.values(),
                             moved[NO_DIRECTOR_MINOR_STATUS], after=resume)
