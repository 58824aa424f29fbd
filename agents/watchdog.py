"""The stalled-job watchdog: finds the jobs whose pilot fell silent or died, and gets them
running again elsewhere.

One cycle (:func:`watch_jobs`), with the lease settings of ``[agents]``:

1. a Matched, Running or Stalled job whose pilot is known dead (Done, Failed, Aborted, Lost)
   is rescheduled at once; a Matched job that pilot never started goes back to its task
   queue without that counting as a reschedule;
2. a Matched job its pilot never reported Running and that has been silent (no heartbeat
   since it was matched) for longer than ``matched_lease`` goes back to its task queue, not
   counted as a reschedule;
3. a Stalled job silent for longer than ``job_lease + stalled_limit`` is rescheduled, or
   Failed once ``taskqueue.max_reschedules`` is reached;
4. a Running or Matched job silent for longer than ``job_lease`` becomes Stalled (step 3
   runs first, so a job is Stalled for at least one cycle before it is rescheduled and its
   pilot has that long to speak again);
5. a Waiting job that the pilots of no configured queue could run gets a minor status that
   says so (taskqueue.queues.unrunnable), and is failed after ``unrunnable_timeout`` when that
   is set: the waiting jobs are read a window at a time until ``UNRUNNABLE_SECONDS`` into the
   turn, the next turn going on where this one stopped.

A rescheduled job is Received again and goes through the optimizer chain in the same
transaction, so it is Waiting (or Failed with the chain's reason) when the batch commits.
Jobs are taken in batches locked with SKIP LOCKED, one transaction per batch, so several
watchdogs may run at once: each job is handled by one of them, once per silence.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from agents.context import AgentContext
from optimizers.chain import optimize_received
from optimizers.outlook import runnable_task_queues
from taskqueue.core.states import JobStatus
from taskqueue.db.database import Session
from taskqueue.pilots.sitestatus import vos_at_work
from taskqueue.queues.stalled import (
    SilentJob,
    describe_silence,
    lock_jobs_of_dead_pilots,
    lock_silent_jobs,
    mark_stalled,
    reschedule_silent_job,
)
from taskqueue.queues.unrunnable import UnrunnableOutcome, mark_unrunnable, task_queue_ids

S = JobStatus

#: Jobs one transaction handles at most.
BATCH = 200
#: Seconds into a turn after which no more window of waiting jobs is read for the minor status
#: saying whether a queue can run them (taskqueue.queues.unrunnable, bounded each): the rest
#: waits for the next turn, which resumes where this one stopped.
UNRUNNABLE_SECONDS = 4.0

Select = Callable[[Session, int], list[SilentJob]]
Handle = Callable[[Session, list[SilentJob]], Counter[str]]


def watch_jobs(ctx: AgentContext, *, batch: int = BATCH) -> str:
    """One watchdog cycle; returns a one-line summary of what it did."""
    now = ctx.now()
    stop_at = time.monotonic() + UNRUNNABLE_SECONDS
    lease = ctx.settings.agents
    max_reschedules = ctx.settings.taskqueue.max_reschedules
    totals: Counter[str] = Counter()

    def dead_pilots(session: Session, jobs: list[SilentJob]) -> Counter[str]:
        plans = []
        for job in jobs:
            reason = f"Pilot {job.pilot_reference} is {job.pilot_status}"
            unstarted = job.status == S.MATCHED and not job.started
            plans.append((job, reason + (", job never started" if unstarted else ""),
                          not unstarted))
        return _reschedule(ctx, session, plans, now, max_reschedules, "dead pilot")

    def unstarted(session: Session, jobs: list[SilentJob]) -> Counter[str]:
        plans = [(job, f"Not started by pilot {job.pilot_reference} within "
                       f"{describe_silence(timedelta(seconds=lease.matched_lease))} of its "
                       "match: back to its task queue", False) for job in jobs]
        return _reschedule(ctx, session, plans, now, max_reschedules, "returned")

    def stalled_too_long(session: Session, jobs: list[SilentJob]) -> Counter[str]:
        plans = [(job, f"Stalled: no heartbeat for {describe_silence(job.silent_for(now))}",
                  True) for job in jobs]
        return _reschedule(ctx, session, plans, now, max_reschedules, "rescheduled")

    def stall(session: Session, jobs: list[SilentJob]) -> Counter[str]:
        moved = mark_stalled(session, jobs, now=now)
        for job in jobs:
            if job.id in moved:
                ctx.log.info("job %d stalled: no heartbeat for %s", job.id,
                             describe_silence(job.silent_for(now)))
        return Counter({"stalled": len(moved)})

    steps: list[tuple[Select, Handle]] = [
        (lambda s, after: lock_jobs_of_dead_pilots(s, limit=batch, after=after), dead_pilots),
        (lambda s, after: lock_silent_jobs(
            s, [S.MATCHED], silent_before=now - timedelta(seconds=lease.matched_lease),
            never_started=True, limit=batch, after=after), unstarted),
        (lambda s, after: lock_silent_jobs(
            s, [S.STALLED],
            silent_before=now - timedelta(seconds=lease.job_lease + lease.stalled_limit),
            limit=batch, after=after), stalled_too_long),
        (lambda s, after: lock_silent_jobs(
            s, [S.MATCHED, S.RUNNING], silent_before=now - timedelta(seconds=lease.job_lease),
            limit=batch, after=after), stall),
    ]
    for select, handle in steps:
        totals += _sweep(ctx, select, handle, batch)
    config = ctx.resources()
    known, (runnable, directed) = ctx.transaction(lambda s: (
        task_queue_ids(s), runnable_task_queues(s, config, vos_at_work(s))))
    unrunnable = UnrunnableOutcome(0, 0, 0)
    while True:  # a window a transaction, for a few seconds; the rest next turn
        step = ctx.transaction(lambda s: mark_unrunnable(
            s, runnable, now=now, fail_after=lease.unrunnable_timeout, known=known,
            directed=directed, after=ctx.unrunnable_after))
        unrunnable += step
        ctx.unrunnable_after = step.after
        if not step.more or time.monotonic() >= stop_at:
            break
    return (f"{totals['stalled']} stalled, {totals['rescheduled']} rescheduled, "
            f"{totals['dead pilot']} of dead pilots rescheduled, "
            f"{totals['returned']} returned to their queue unstarted, "
            f"{totals['failed']} failed at the maximum of reschedules, "
            f"{totals['chain failed']} failed in the optimizer chain, {unrunnable.line()}")


def _sweep(ctx: AgentContext, select: Select, handle: Handle, batch: int) -> Counter[str]:
    """Run one rule over all its candidates, one transaction per batch, in id order."""
    totals: Counter[str] = Counter()
    after = 0
    while True:
        def work(session: Session, after: int = after) -> tuple[int, int, Counter[str]]:
            jobs = select(session, after)
            return (jobs[-1].id if jobs else after, len(jobs),
                    handle(session, jobs) if jobs else Counter())
        after, found, done = ctx.transaction(work)
        totals += done
        if found < batch:
            return totals


def _reschedule(ctx: AgentContext, session: Session,
                plans: Sequence[tuple[SilentJob, str, bool]], now: datetime,
                max_reschedules: int, kind: str) -> Counter[str]:
    """Reschedule each planned job (job, reason, counted), then run the optimizer chain on
    those that are Received again."""
    done: Counter[str] = Counter()
    received: list[int] = []
    for job, reason, counted in plans:
        new = reschedule_silent_job(session, job, now=now, reason=reason,
                                    max_reschedules=max_reschedules, count=counted)
        if new is None:
            continue
        if new == S.RECEIVED:
            received.append(job.id)
            done[kind] += 1
            ctx.log.info("job %d %s: %s", job.id,
                         "rescheduled" if counted else "returned to its queue", reason)
        elif new == S.FAILED:
            done["failed"] += 1
            ctx.log.warning("job %d failed: %s; maximum of %d reschedules reached", job.id,
                            reason, max_reschedules)
    if received:
        result = optimize_received(session, ctx.chain_context(), job_ids=received,
                                   limit=len(received))
        for job_id, why in sorted(result.failed.items()):
            ctx.log.warning("job %d failed in the optimizer chain: %s", job_id, why)
        done["chain failed"] += len(result.failed)
    return done
