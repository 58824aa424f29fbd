"""What each site and queue is doing, for the dashboard's sites and pilots pages: jobs running
there, pilots by status and when one was last seen, how full the site limits are, the site
director's trouble, and how many waiting jobs a queue's pilots could run.

The counts that read whole tables (pilots, waiting jobs) are taken once a turn by the activity
loop into ``queue_status`` (:func:`record_queue_status`); a page reads that snapshot and the
small live tables (limits, the director's queues), so its cost does not grow with the grid.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import and_, case, delete, func, select
from sqlalchemy.orm import Session

from taskqueue.db.bulk import insert_rows
from taskqueue.db.models import (
    DirectorQueue,
    Job,
    Pilot,
    SiteLimit,
    queue_status_table,
    task_queues_table,
)
from taskqueue.matching.limits import LIMIT_ATTRIBUTES, RUNNING_STATES, site_limits
from taskqueue.pilots.records import ALIVE_STATES

QueueKey = tuple[str, str, str]
#: A queue for one VO: (vo, site, CE, queue).
VoQueueKey = tuple[str, str, str, str]


@dataclass
class QueuePilots:
    """A queue's pilots: those alive by status, those that ended since a moment by status,
    and when any of them last spoke to the matcher."""

    alive: dict[str, int] = field(default_factory=dict)
    ended: dict[str, int] = field(default_factory=dict)
    last_seen: datetime | None = None

    def to_json(self) -> str:
        return json.dumps({"alive": self.alive, "ended": self.ended}, sort_keys=True)


def pilots_by_queue(session: Session, *, ended_since: datetime
                    ) -> dict[VoQueueKey, QueuePilots]:
    """Per (VO, site, CE, queue): the pilots by status (ended ones only since
    ``ended_since``) and the last time one was seen. Reads every pilot record: the activity
    loop calls it, not a page."""
    p = Pilot.__table__.c
    recent = func.sum(case((p.updated_at >= ended_since, 1), else_=0))
    out: dict[VoQueueKey, QueuePilots] = defaultdict(QueuePilots)
    for vo, site, ce, queue, status, n, n_recent, seen in session.execute(
            select(p.vo, p.site, p.ce, p.queue, p.status, func.count(), recent,
                   func.max(p.last_seen_at))
            .group_by(p.vo, p.site, p.ce, p.queue, p.status)):
        entry = out[(vo, site, ce, queue)]
        if status in ALIVE_STATES:
            entry.alive[status] = int(n)
        elif n_recent:
            entry.ended[status] = int(n_recent)
        if seen is not None and (entry.last_seen is None or seen > entry.last_seen):
            entry.last_seen = seen
    return dict(out)


def running_by_queue(session: Session) -> dict[VoQueueKey, int]:
    """Jobs matched or running, per (VO, site, CE, queue) of the pilot that holds them (read
    through the status index: the cost follows the running jobs)."""
    j, p = Job.__table__.c, Pilot.__table__.c
    return {(vo, site, ce, queue): int(n) for vo, site, ce, queue, n in session.execute(
        select(j.vo, p.site, p.ce, p.queue, func.count())
        .join_from(Job.__table__, Pilot.__table__,
                   and_(p.reference == j.pilot_reference, p.vo == j.vo))
        .where(j.status.in_(RUNNING_STATES))
        .group_by(j.vo, p.site, p.ce, p.queue))}


def record_queue_status(session: Session, *, now: datetime,
                        outlook: dict[VoQueueKey, tuple[int, int]]) -> int:
    """Replace the queue snapshot: every queue of ``outlook`` (the configured ones, with the
    waiting jobs their pilots could run and the task queues those are in) and every queue
    with pilots or running jobs. Returns the rows written."""
    pilots = pilots_by_queue(session, ended_since=now - timedelta(hours=24))
    running = running_by_queue(session)
    rows = []
    for key in sorted(set(outlook) | set(pilots) | set(running)):
        vo, site, ce, queue = key
        seen = pilots.get(key, QueuePilots())
        waiting, task_queues = outlook.get(key, (None, None))
        rows.append({"vo": vo, "site": site, "ce": ce, "queue": queue, "at": now,
                     "configured": int(key in outlook), "running": running.get(key, 0),
                     "waiting_for": waiting, "task_queues": task_queues,
                     "pilots": seen.to_json(), "last_pilot_seen": seen.last_seen})
    session.execute(delete(queue_status_table))
    insert_rows(session.connection(), queue_status_table, rows)
    return len(rows)


@dataclass(frozen=True)
class QueueState:
    """One queue of the snapshot, as the pages show it."""

    site: str
    ce: str
    queue: str
    at: datetime
    configured: bool
    running: int
    waiting_for: int | None
    task_queues: int | None
    pilots: QueuePilots


def queue_states(session: Session, vo: str, *, site: str | None = None,
                 ce: str | None = None, queue: str | None = None) -> list[QueueState]:
    """The VO's queues in the snapshot (narrowed to a site, CE or queue), in name order."""
    q = queue_status_table.c
    stmt = select(queue_status_table).where(q.vo == vo)
    for column, value in ((q.site, site), (q.ce, ce), (q.queue, queue)):
        if value is not None:
            stmt = stmt.where(column == value)
    out = []
    for row in session.execute(stmt.order_by(q.site, q.ce, q.queue)):
        counts = json.loads(row.pilots)
        out.append(QueueState(row.site, row.ce, row.queue, row.at, bool(row.configured),
                              row.running, row.waiting_for, row.task_queues,
                              QueuePilots(counts.get("alive", {}), counts.get("ended", {}),
                                          row.last_pilot_seen)))
    return out


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


def vos_at_work(session: Session) -> list[str]:
    """The VOs with task queues or pilots."""
    tq, p = task_queues_table.c, Pilot.__table__.c
    return sorted(set(session.scalars(select(tq.vo).distinct()))
                  | set(session.scalars(select(p.vo).where(p.status.in_(ALIVE_STATES))
                                        .distinct())))
