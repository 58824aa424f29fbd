"""Periodic maintenance: SubmitPool refresh, fair-share recomputation and cleanup.

- :func:`refresh_submit_pools` re-evaluates every SubmitPool's eligible queues against the
  resources configuration as it is now (a queue that gained a required parameter becomes
  eligible, one that lost it no longer is), stamps the refresh time, and drops the pools no
  pending job has used within ``taskqueue.submit_pool_grace``;
- :func:`recompute_shares` recomputes the fair-share priorities of every task queue;
- :func:`clean_up` deletes task queues empty for longer than ``taskqueue.empty_queue_grace``
  and unused SubmitPools;
- :func:`record_dashboard_activity` keeps the dashboard's counters and job-count snapshots.

Each returns a one-line summary. Several agent processes may run them at once: pools are
taken in batches locked with SKIP LOCKED, and the deletions skip what others hold.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from agents.context import AgentContext
from optimizers.outlook import queue_outlook
from optimizers.resources import ResourcesConfig, eligible_queues
from taskqueue.core.errors import InvalidRequirementsError
from taskqueue.db.database import Session
from taskqueue.pilots.activity import Retention, record_activity
from taskqueue.pilots.sitestatus import record_queue_status, vos_at_work
from taskqueue.queues.shares import recompute_priorities
from taskqueue.queues.submitpools import (
    PoolInUse,
    delete_unused_submit_pools,
    lock_submit_pools,
    set_pool_queues,
)
from taskqueue.queues.taskqueues import delete_empty_queues

#: SubmitPools one refresh transaction handles at most.
POOL_BATCH = 100


def refresh_submit_pools(ctx: AgentContext, *, batch: int = POOL_BATCH) -> str:
    """Re-evaluate every SubmitPool's eligible queues, then drop unused pools."""
    now = ctx.now()
    config = ctx.resources()
    refreshed = skipped = unplaceable = 0
    after = ""
    while True:
        def work(session: Session, after: str = after) -> tuple[str, int, int, int, int]:
            pools = lock_submit_pools(session, limit=batch, after=after)
            done = without_vo = empty = 0
            for pool in pools:
                if not pool.vos:
                    without_vo += 1
                    continue
                queues = _eligible(ctx, config, pool)
                set_pool_queues(session, pool.id, queues, now=now)
                done += 1
                if not queues:
                    empty += 1
                    ctx.log.warning("SubmitPool %s: no queue of %s meets its requirements %s "
                                    "any more", pool.id, config.origin, pool.requirements)
            return (pools[-1].id if pools else after, len(pools), done, without_vo, empty)
        after, found, done, without_vo, empty = ctx.transaction(work)
        refreshed, skipped, unplaceable = (refreshed + done, skipped + without_vo,
                                           unplaceable + empty)
        if found < batch:
            break
    dropped = _drop_unused_pools(ctx, now)
    return (f"{refreshed} SubmitPools refreshed ({unplaceable} with no eligible queue), "
            f"{skipped} without jobs skipped, {len(dropped)} unused deleted")


def _eligible(ctx: AgentContext, config: ResourcesConfig, pool: PoolInUse
              ) -> list[tuple[str, str, str]]:
    """The queues eligible for the pool's requirements for any of its VOs."""
    queues: set[tuple[str, str, str]] = set()
    for vo in pool.vos:
        try:
            queues.update(eligible_queues(config, pool.requirements, vo=vo))
        except InvalidRequirementsError as exc:
            ctx.log.warning("SubmitPool %s (VO %s): %s", pool.id, vo, exc.message)
    return sorted(queues)


def _drop_unused_pools(ctx: AgentContext, now: datetime) -> list[str]:
    grace = timedelta(seconds=ctx.settings.taskqueue.submit_pool_grace)
    dropped = ctx.transaction(lambda s: delete_unused_submit_pools(s, now=now, grace=grace))
    for pool_id in dropped:
        ctx.log.info("SubmitPool %s deleted: no pending job used it within %d s", pool_id,
                     ctx.settings.taskqueue.submit_pool_grace)
    return dropped


def recompute_shares(ctx: AgentContext) -> str:
    """Recompute the fair-share priority of every task queue."""
    changed = ctx.transaction(lambda s: recompute_priorities(s, ctx.settings))
    return f"{len(changed)} task queue priorities changed"


def clean_up(ctx: AgentContext) -> str:
    """Delete task queues empty for longer than their grace period, and unused SubmitPools."""
    now = ctx.now()
    queues = ctx.transaction(lambda s: delete_empty_queues(s, ctx.settings, now=now))
    if queues:
        ctx.log.info("deleted %d empty task queues: %s", len(queues),
                     ", ".join(str(q) for q in queues[:20]))
    pools = _drop_unused_pools(ctx, now)
    return f"{len(queues)} empty task queues deleted, {len(pools)} unused SubmitPools deleted"


def record_dashboard_activity(ctx: AgentContext) -> str:
    """The dashboard's counters for the last minutes, their roll-ups, the job-count and queue
    snapshots, and the pruning of old rows (taskqueue.pilots.activity,
    taskqueue.pilots.sitestatus)."""
    d = ctx.settings.dashboard
    retention = Retention(timedelta(seconds=d.minute_retention),
                          timedelta(seconds=d.hour_retention),
                          timedelta(seconds=d.day_retention))
    now = ctx.now()
    config = ctx.resources()

    def work(session: Session) -> str:
        summary = record_activity(session, now=now, retention=retention)
        outlook = queue_outlook(session, config, vos_at_work(session), summary.waiting)
        queues = record_queue_status(session, now=now, outlook=outlook)
        return f"{summary.line()}, {queues} queues in the queue snapshot"

    return ctx.transaction(work)
