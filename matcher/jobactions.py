"""What an owner or an operator does to a job, shared by the API and the dashboard so that
both act through the same task-queue functions with the same checks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from matcher.access import accessible_job
from matcher.auth import Principal
from matcher.runtime import Runtime
from optimizers.chain import optimize_received
from taskqueue.db.database import Session
from taskqueue.db.models import Job
from taskqueue.queues.jobcontrol import kill_job, reschedule_job


def kill(session: Session, principal: Principal, job_id: int, *, now: datetime,
         reason: str = "") -> dict[str, Any]:
    """Kill a job the principal may act on; its status afterwards."""
    accessible_job(session, principal, job_id)
    kill_job(session, job_id, by=principal.name, now=now,
             reason=f"Killed by {principal.name}" + (f": {reason}" if reason else ""))
    return job_status(session, job_id)


def reschedule(session: Session, runtime: Runtime, principal: Principal, job_id: int, *,
               now: datetime, reason: str = "") -> dict[str, Any]:
    """Send a job the principal may act on back through the optimizer chain; its status
    once the chain ran."""
    accessible_job(session, principal, job_id)
    reschedule_job(session, job_id, by=principal.name, now=now,
                   reason=reason or f"Rescheduled by {principal.name}",
                   max_reschedules=runtime.settings.taskqueue.max_reschedules,
                   fail_when_exhausted=False)
    optimize_received(session, runtime.chain_context(now), job_ids=[job_id])
    return job_status(session, job_id)


def job_status(session: Session, job_id: int) -> dict[str, Any]:
    job = session.get(Job, job_id, populate_existing=True)
    assert job is not None
    return {"job_id": job.id, "status": job.status, "minor_status": job.minor_status}
