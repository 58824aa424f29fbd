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
from datetime import datetime

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from taskqueue.core.errors import InvalidInputError, NotFoundError
from taskqueue.core.settings import Settings
from taskqueue.db.models import GroupShare, TaskQueue, task_queues_table

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
                         groups: Iterable[tuple[str, str]] | None = None, *,
                         only: Iterable[int] | None = None) -> dict[int, float]:
    """Recompute the priorities of the queues of ``groups`` ((vo, group) pairs), or of every
    queue, and store those that changed (only those in ``only``, if given). Returns them.

    Reads the queue rows alone (each keeps its jobs' mean priority), never the jobs.
    """
    stmt = select(TaskQueue.id, TaskQueue.vo, TaskQueue.owner_group, TaskQueue.owner,
                  TaskQueue.priority, TaskQueue.draw_key, TaskQueue.mean_job_priority)
    wanted = set(groups) if groups is not None else None
    if wanted is not None:
        if not wanted:
            return {}
        stmt = stmt.where(TaskQueue.owner_group.in_(sorted({g for _, g in wanted})))
    rows = [r for r in session.execute(stmt) if wanted is None or (r.vo, r.owner_group) in wanted]
    new: dict[int, float] = {}
    for vo in sorted({r.vo for r in rows}):  # each VO's operators set its own shares
        inputs = [QueueShareInput(r.id, r.vo, r.owner_group, r.owner, r.mean_job_priority)
                  for r in rows if r.vo == vo]
        new.update(compute_priorities(inputs, shares_in_force(session, settings, vo),
                                      settings.taskqueue.default_share))
    by_id = {r.id: r for r in rows}
    write = set(only) if only is not None else set(new)
    changed = {tq: p for tq, p in new.items()
               if tq in write and abs(by_id[tq].priority - p) > 1e-12 * p}
    clocks: dict[str, float] = {}
    updates = []
    for tq_id in sorted(changed):  # sorted: concurrent recomputations lock rows in one order
        row = by_id[tq_id]
        if row.vo not in clocks:
            clocks[row.vo] = virtual_time(session, row.vo)
        updates.append({"b_id": tq_id, "b_priority": changed[tq_id],
                        "b_key": rescaled_key(row.draw_key, clocks[row.vo], row.priority,
                                              changed[tq_id])})
    if updates:
        session.connection().execute(_SET_PRIORITY, updates)
    return changed


_SET_PRIORITY = (
    update(task_queues_table).where(task_queues_table.c.id == bindparam("b_id"))
    .values(priority=bindparam("b_priority"), draw_key=bindparam("b_key"))
)


def shares_in_force(session: Session, settings: Settings, vo: str) -> dict[str, float]:
    """Each group's share in a VO: the settings file's, overridden by those its operators
    set."""
    shares = dict(settings.taskqueue.shares)
    shares.update({row.owner_group: row.share for row in session.execute(
        select(GroupShare.owner_group, GroupShare.share).where(GroupShare.vo == vo))})
    return shares


@dataclass(frozen=True)
class ShareEntry:
    owner_group: str
    share: float
    #: "operator" (set through the API, stored in the database) or "settings" (the file's).
    source: str


def share_table(session: Session, settings: Settings, vo: str) -> list[ShareEntry]:
    """Every group of the VO with a share of its own, and where that share comes from."""
    entries = {group: ShareEntry(group, share, "settings")
               for group, share in settings.taskqueue.shares.items()}
    for row in session.execute(select(GroupShare.owner_group, GroupShare.share)
                               .where(GroupShare.vo == vo)):
        entries[row.owner_group] = ShareEntry(row.owner_group, row.share, "operator")
    return [entries[g] for g in sorted(entries)]


def set_share(session: Session, settings: Settings, vo: str, group: str, share: float, *,
              by: str, now: datetime) -> dict[int, float]:
    """Set a group's share in a VO and bring its queues' priorities up to date at once."""
    if not group.strip():
        raise InvalidInputError("a group name must not be empty")
    if not share > 0 or share == float("inf"):
        raise InvalidInputError(f"a share must be a positive number, got {share}")
    row = session.get(GroupShare, (vo, group), with_for_update=True)
    if row is None:
        session.add(GroupShare(vo=vo, owner_group=group, share=share, updated_by=by,
                               updated_at=now))
    else:
        row.share, row.updated_by, row.updated_at = share, by, now
    session.flush()
    return recompute_priorities(session, settings, [(vo, group)])


def reset_share(session: Session, settings: Settings, vo: str, group: str) -> dict[int, float]:
    """Drop an operator's share for a group: the settings file's (or the default) applies."""
    row = session.get(GroupShare, (vo, group), with_for_update=True)
    if row is None:
        raise NotFoundError(f"no share was set for group {group} in VO {vo}")
    session.delete(row)
    session.flush()
    return recompute_priorities(session, settings, [(vo, group)])


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
    """The draw's current time for a VO: the time of its last draw, the largest clock among
    its active queues (each holds the key it had when last drawn, or the time it started).

    Not the smallest key: that is the next draw's time, and a queue whose clock started there
    would come after every queue already waiting, each time."""
    value = session.execute(
        select(func.max(TaskQueue.draw_clock)).where(TaskQueue.active == 1, TaskQueue.vo == vo)
    ).scalar_one_or_none()
    return float(value or 0.0)
