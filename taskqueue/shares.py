"""Fair share: task-queue priorities derived from the owner groups' shares.

The rule is the reference system's: each owner group has a share; a group that shares jobs
splits it over its task queues in proportion to their jobs' mean user priority; a group that
does not share jobs first splits it evenly over its owners, and each owner's part is split over
that owner's queues the same way. Priorities are the weights of the matcher's random draw, so
they are kept strictly positive.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from taskqueue.models import TaskQueue, TaskQueueJob
from taskqueue.settings import Settings

#: The smallest priority a queue gets, as a fraction of its entity's share: a queue whose jobs
#: all have user priority 0 keeps a (tiny) chance in the draw, since draw weights must be > 0.
MIN_PRIORITY_FRACTION = 1e-6


@dataclass(frozen=True)
class QueueShareInput:
    tq_id: int
    vo: str
    owner_group: str
    owner: str | None
    mean_job_priority: float


def compute_priorities(queues: Iterable[QueueShareInput],
                       share_of: Mapping[str, float] | None = None,
                       default_share: float = 1.0) -> dict[int, float]:
    """Priorities for ``queues`` by the fair-share rule (pure arithmetic, no database)."""
    shares = share_of or {}
    # entity = (vo, group, owner or None): the unit a share is split over.
    by_group: dict[tuple[str, str], dict[str | None, list[QueueShareInput]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for q in queues:
        by_group[(q.vo, q.owner_group)][q.owner].append(q)
    result: dict[int, float] = {}
    for (_vo, group), owners in by_group.items():
        group_share = shares.get(group, default_share)
        owner_share = group_share / len(owners)
        for entity_queues in owners.values():
            total = sum(q.mean_job_priority for q in entity_queues)
            for q in entity_queues:
                if total > 0:
                    prio = owner_share * q.mean_job_priority / total
                else:
                    prio = owner_share / len(entity_queues)
                result[q.tq_id] = max(prio, owner_share * MIN_PRIORITY_FRACTION)
    return result


def recompute_priorities(session: Session, settings: Settings,
                         groups: Iterable[tuple[str, str]] | None = None) -> dict[int, float]:
    """Recompute and store the priorities of the queues of ``groups`` ((vo, group) pairs), or
    of every queue; return the new priorities of the queues that changed."""
    mean = (
        select(TaskQueueJob.tq_id, func.avg(-TaskQueueJob.rank).label("mean"))
        .group_by(TaskQueueJob.tq_id)
        .subquery()
    )
    stmt = select(
        TaskQueue.id, TaskQueue.vo, TaskQueue.owner_group, TaskQueue.owner, TaskQueue.priority,
        TaskQueue.draw_key, mean.c.mean,
    ).outerjoin(mean, mean.c.tq_id == TaskQueue.id)
    wanted = set(groups) if groups is not None else None
    if wanted is not None:
        if not wanted:
            return {}
        stmt = stmt.where(TaskQueue.owner_group.in_({g for _, g in wanted}))
    rows = [r for r in session.execute(stmt) if wanted is None or (r.vo, r.owner_group) in wanted]
    inputs = [
        QueueShareInput(r.id, r.vo, r.owner_group, r.owner, float(r.mean or 0.0)) for r in rows
    ]
    new = compute_priorities(inputs, settings.taskqueue.shares, settings.taskqueue.default_share)
    by_id = {r.id: r for r in rows}
    changed = {tq: p for tq, p in new.items() if abs(by_id[tq].priority - p) > 1e-12 * p}
    now_of_vo: dict[str, float] = {}
    # Sorted, so that concurrent recomputations lock rows in the same order.
    for tq_id in sorted(changed):
        row = by_id[tq_id]
        if row.vo not in now_of_vo:
            now_of_vo[row.vo] = virtual_time(session, row.vo)
        session.execute(update(TaskQueue).where(TaskQueue.id == tq_id).values(
            priority=changed[tq_id],
            draw_key=rescaled_key(row.draw_key, now_of_vo[row.vo], row.priority,
                                  changed[tq_id])))
    return changed


def rescaled_key(key: float, now: float, old_rate: float, new_rate: float) -> float:
    """The draw key of a queue whose priority changes from ``old_rate`` to ``new_rate``.

    The time left on an exponential clock of rate ``old_rate``, scaled by old/new, is again
    exponential, of rate ``new_rate``: the queue's next draw is as if it always had the new
    priority. A key already behind the draw's current time is left as it is.
    """
    if key <= now:
        return key
    return now + (key - now) * old_rate / new_rate


def virtual_time(session: Session, vo: str) -> float:
    """The draw's current time for a VO: the smallest key among its active queues."""
    value = session.execute(
        select(func.min(TaskQueue.draw_key)).where(TaskQueue.active == 1, TaskQueue.vo == vo)
    ).scalar_one_or_none()
    return float(value or 0.0)
