"""What each site and queue is doing now, for the dashboard's sites and pilots pages: jobs
running there, pilots by status and when one was last seen, how full the site limits are, the
site director's trouble, and how many waiting jobs a queue's pilots could run.

Every query reads the live tables through their indexes; their cost follows what is active
(running jobs, limits, task queues), not the history kept in the database.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from taskqueue.limits import LIMIT_ATTRIBUTES, RUNNING_STATES, site_limits
from taskqueue.matching import ExpressionCheck, condition_parameters, queue_conditions
from taskqueue.models import (
    DirectorQueue,
    Job,
    Pilot,
    SiteLimit,
    TaskQueueJob,
    task_queues_table,
)
from taskqueue.pilots import ALIVE_STATES, PILOT_STATES
from taskqueue.resources import Resource

QueueKey = tuple[str, str, str]


@dataclass
class QueuePilots:
    """A queue's pilots: those alive by status, those that ended since a moment by status,
    and when any of them last spoke to the matcher."""

    alive: dict[str, int] = field(default_factory=dict)
    ended: dict[str, int] = field(default_factory=dict)
    last_seen: datetime | None = None


def pilots_by_queue(session: Session, vo: str, *, ended_since: datetime
                    ) -> dict[QueueKey, QueuePilots]:
    """Per (site, CE, queue) of the VO's pilots: counts by status (ended ones only since
    ``ended_since``) and the last time one was seen."""
    p = Pilot.__table__.c
    recent = func.sum(case((p.updated_at >= ended_since, 1), else_=0))
    out: dict[QueueKey, QueuePilots] = defaultdict(QueuePilots)
    for site, ce, queue, status, n, n_recent, seen in session.execute(
            select(p.site, p.ce, p.queue, p.status, func.count(), recent, func.max(p.last_seen_at))
            .where(p.vo == vo).group_by(p.site, p.ce, p.queue, p.status)):
        entry = out[(site, ce, queue)]
        if status in ALIVE_STATES:
            entry.alive[status] = int(n)
        elif n_recent:
            entry.ended[status] = int(n_recent)
        if seen is not None and (entry.last_seen is None or seen > entry.last_seen):
            entry.last_seen = seen
    return dict(out)


def running_by_queue(session: Session, vo: str) -> dict[QueueKey, int]:
    """The VO's jobs matched or running, per (site, CE, queue) of the pilot that holds them
    (read through the status index: the cost follows the running jobs)."""
    j, p = Job.__table__.c, Pilot.__table__.c
    return {(site, ce, queue): int(n) for site, ce, queue, n in session.execute(
        select(p.site, p.ce, p.queue, func.count())
        .join_from(Job.__table__, Pilot.__table__, p.reference == j.pilot_reference)
        .where(j.status.in_(RUNNING_STATES), j.vo == vo)
        .group_by(p.site, p.ce, p.queue))}


@dataclass(frozen=True)
class LimitUsage:
    limit: SiteLimit
    #: Jobs the limit counts now (None for a limit on the matching delay only).
    running: int | None

    @property
    def fill(self) -> float | None:
        """How full a running limit is, 0 to 1 (or more, if the limit was lowered)."""
        if self.running is None or self.limit.max_running is None:
            return None
        return self.running / self.limit.max_running if self.limit.max_running else 1.0


def limit_usage(session: Session, vo: str) -> list[LimitUsage]:
    """The VO's site limits and the jobs each counts now, as the matcher counts them."""
    jobs = Job.__table__.c
    out = []
    for limit in site_limits(session, vo):
        running = None
        if limit.max_running is not None:
            stmt = select(func.count()).select_from(Job.__table__).where(
                jobs.site == limit.site, jobs.status.in_(RUNNING_STATES),
                LIMIT_ATTRIBUTES[limit.attribute] == limit.value)
            if limit.ce:
                stmt = stmt.where(jobs.ce == limit.ce)
            running = int(session.execute(stmt).scalar_one())
        out.append(LimitUsage(limit, running))
    return out


def director_states(session: Session) -> dict[QueueKey, DirectorQueue]:
    """The site director's record of each queue it served (failures, back-off, last error)."""
    return {(d.site, d.ce, d.queue): d for d in session.scalars(select(DirectorQueue))}


def waiting_per_task_queue(session: Session, vo: str) -> dict[int, int]:
    """Waiting jobs of each of the VO's non-empty task queues."""
    tq = task_queues_table.c
    return {int(tq_id): int(n) for tq_id, n in session.execute(
        select(TaskQueueJob.tq_id, func.count())
        .join(task_queues_table, tq.id == TaskQueueJob.tq_id)
        .where(tq.vo == vo).group_by(TaskQueueJob.tq_id))}


def matching_task_queues(session: Session, resource: Resource,
                         check: ExpressionCheck) -> list[int]:
    """The ids of the task queues (empty or not) ``resource`` could be served from: the
    matcher's own conditions, and ``check`` for queues that carry a ClassAd expression."""
    tq = task_queues_table.c
    rows = session.connection().execute(
        select(tq.id, tq.expression).where(*queue_conditions(resource, with_expressions=True)),
        condition_parameters(resource))
    return [int(r.id) for r in rows if r.expression is None or check(r.expression)]


def waiting_for(session: Session, resources: Iterable[tuple[QueueKey, Resource,
                                                             ExpressionCheck]],
                waiting: dict[int, int]) -> dict[QueueKey, tuple[int, int]]:
    """For each queue's resource description: the waiting jobs its pilots could run and the
    non-empty task queues they are in (``waiting``: from :func:`waiting_per_task_queue`)."""
    out = {}
    for key, resource, check in resources:
        ids = [i for i in matching_task_queues(session, resource, check) if waiting.get(i)]
        out[key] = (sum(waiting[i] for i in ids), len(ids))
    return out


#: Pilot statuses in their order, for tables.
PILOT_COLUMNS = PILOT_STATES
