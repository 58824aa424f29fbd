"""Plain-text tables for people: what the CLI and the demo print."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from taskqueue.core.buckets import memory_text
from taskqueue.db.models import (
    Job,
    JobStatusHistory,
    TaskQueue,
    TaskQueueBannedSite,
    TaskQueueJob,
    TaskQueuePlatform,
    TaskQueueSite,
    TaskQueueTag,
)


def queue_table(session: Session, limit: int) -> str:
    """The ``limit`` largest task queues, one line each, with a header and a total."""
    rows = session.execute(
        select(TaskQueue, func.count(TaskQueueJob.job_id).label("n"))
        .outerjoin(TaskQueueJob, TaskQueueJob.tq_id == TaskQueue.id)
        .group_by(TaskQueue.id)
        .order_by(func.count(TaskQueueJob.job_id).desc(), TaskQueue.id)
    ).all()
    shown = rows[:limit]
    values = _values(session, [tq.id for tq, _ in shown])
    totals: dict[str, float] = {}
    for tq, n in rows:
        if n:
            totals[tq.vo] = totals.get(tq.vo, 0.0) + tq.priority
    lines = [f"{'id':>6} {'vo':<8} {'group':<12} {'owner':<10} {'cpu(s)':>8} {'cores':>5} "
             f"{'memory':>10} {'type':<12} {'jobs':>6} {'draws %':>7}  conditions"]
    for tq, n in shown:
        conditions = values.get(tq.id, "")
        if tq.submit_pool:
            conditions += f" pool={tq.submit_pool[:10]}"
        if tq.expression:
            conditions += f" expr=({tq.expression})"
        lines.append(
            f"{tq.id:>6} {tq.vo:<8} {tq.owner_group:<12} {tq.owner or '(all)':<10} "
            f"{tq.cpu_time:>8} {tq.processors:>5} {memory_text(tq.memory):>10} "
            f"{tq.job_type:<12} {n:>6} "
            f"{draw_share(tq.priority, totals.get(tq.vo, 0.0) if n else 0.0):>7}  "
            f"{conditions.strip()}".rstrip())
    total = sum(n for _, n in rows)
    lines.append(f"{len(rows)} task queues, {total} waiting jobs"
                 + (f" ({len(rows) - limit} more queues not shown)" if len(rows) > limit else "")
                 + "; draws %: the share of matches a queue gets while pilots could run any "
                   "of its VO's queues (its fair-share priority over their sum)")
    return "\n".join(lines)


def draw_share(priority: float, vo_total: float) -> str:
    """A queue's priority as its percentage of its VO's draws ("-": an empty queue)."""
    if vo_total <= 0:
        return "-"
    share = 100 * priority / vo_total
    return "<0.01" if 0 < share < 0.005 else f"{share:.2f}"


def _values(session: Session, tq_ids: list[int]) -> dict[int, str]:
    parts: dict[int, list[str]] = {}
    for label, table in (("sites", TaskQueueSite), ("banned", TaskQueueBannedSite),
                         ("platforms", TaskQueuePlatform), ("tags", TaskQueueTag)):
        grouped: dict[int, list[str]] = {}
        for tq_id, value in session.execute(
                select(table.tq_id, table.value).where(table.tq_id.in_(tq_ids))
                .order_by(table.tq_id, table.value)):
            grouped.setdefault(tq_id, []).append(value)
        for tq_id, vals in grouped.items():
            parts.setdefault(tq_id, []).append(f"{label}={','.join(vals)}")
    return {tq_id: " ".join(p) for tq_id, p in parts.items()}


def jobs_table(session: Session, *, status: str | None = None, owner: str | None = None,
               site: str | None = None, limit: int = 50) -> str:
    """The newest jobs matching the filters, one line each."""
    stmt = select(Job).order_by(Job.id.desc()).limit(limit)
    if status:
        stmt = stmt.where(Job.status == status)
    if owner:
        stmt = stmt.where(Job.owner == owner)
    if site:
        stmt = stmt.where(Job.site == site)
    rows = list(session.scalars(stmt))
    lines = [f"{'id':>8} {'status':<11} {'owner':<12} {'group':<12} {'site':<18} "
             f"{'submitted (UTC)':<19}  minor status"]
    for job in rows:
        lines.append(f"{job.id:>8} {job.status:<11} {job.owner:<12} {job.owner_group:<12} "
                     f"{job.site or '-':<18} {job.submitted_at:%Y-%m-%d %H:%M:%S}  "
                     f"{job.minor_status}")
    lines.append(f"{len(rows)} job(s)" + (" (the newest shown; use --limit for more)"
                                          if len(rows) == limit else ""))
    return "\n".join(lines)


def history_table(session: Session, job_id: int) -> str:
    rows = session.scalars(select(JobStatusHistory).where(JobStatusHistory.job_id == job_id)
                           .order_by(JobStatusHistory.id))
    return "\n".join(f"    {h.at:%Y-%m-%d %H:%M:%S}  {h.status:<11} {h.source:<10} "
                     f"{h.minor_status}" for h in rows)
