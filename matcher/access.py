"""Who may act on which job: users on their own, operators on their VO's, pilots on the jobs
they were given (checked in taskqueue.pilots.pilotreports)."""

from __future__ import annotations

from matcher.auth import OPERATOR, USER, Principal
from matcher.problems import Problem
from taskqueue.core.errors import NotFoundError
from taskqueue.db.database import Session
from taskqueue.db.models import Job


def accessible_job(session: Session, principal: Principal, job_id: int) -> Job:
    """The job, if ``principal`` may see and act on it; 404 or 403 otherwise. Another VO's
    job is 404, like one that does not exist: a token learns nothing of other VOs' ids."""
    job = session.get(Job, job_id)
    if job is None or job.vo != principal.vo:
        raise NotFoundError(f"job {job_id} does not exist")
    if principal.role == USER and job.owner != principal.subject:
        raise Problem(403, f"job {job_id} belongs to another user; a user token acts on its "
                      "own jobs only")
    if principal.role not in (USER, OPERATOR):
        raise Problem(403, f"a {principal.role} token cannot act on jobs here")
    return job
