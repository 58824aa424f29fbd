"""/api/v1/jobs/kill, /reschedule and /delete: one action on many jobs in one request.

Each job is acted on in a savepoint of its own, so one job that cannot be killed (it ended,
it is another user's) does not undo the others: the answer lists the jobs acted on with their
status afterwards, and each refused job with the HTTP status and the reason it would have got
alone. Jobs are locked in id order, so two bulk requests over the same jobs cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flask import Blueprint

from matcher import schemas
from matcher.api import JSON, Call, endpoint
from matcher.auth import OPERATOR, USER, Principal
from matcher.problems import status_of
from optimizers.chain import optimize_received
from taskqueue.core.errors import GridpilotError
from taskqueue.db.database import Session
from taskqueue.queues.jobcontrol import (
    delete_job,
    kill_job,
    owners_of,
    reschedule_job,
    statuses_of,
)

bp = Blueprint("bulkjobs", __name__, url_prefix="/api/v1/jobs")
OWNERS = (USER, OPERATOR)

Action = Callable[[Session, int], object]


def _refusals(session: Session, principal: Principal, job_ids: Sequence[int]
              ) -> dict[int, tuple[int, str]]:
    """The jobs ``principal`` may not act on, with the HTTP status and reason for each: a job
    of another VO is as good as absent (404), another user's is forbidden (403)."""
    found = owners_of(session, job_ids)
    refused: dict[int, tuple[int, str]] = {}
    for job_id in job_ids:
        vo, owner = found.get(job_id, (None, None))
        if vo != principal.vo:
            refused[job_id] = (404, f"job {job_id} does not exist")
        elif principal.role == USER and owner != principal.subject:
            refused[job_id] = (403, f"job {job_id} belongs to another user; a user token acts "
                                    "on its own jobs only")
    return refused


def _act_on_each(session: Session, principal: Principal, job_ids: Sequence[int],
                 action: Action) -> tuple[list[int], list[dict[str, Any]]]:
    """Apply ``action`` to each job the principal may act on, each in its own savepoint;
    returns the jobs acted on and the errors."""
    ids = sorted(set(job_ids))
    refused = _refusals(session, principal, ids)
    done: list[int] = []
    errors: list[dict[str, Any]] = [{"job_id": j, "code": code, "detail": detail}
                                    for j, (code, detail) in sorted(refused.items())]
    for job_id in ids:
        if job_id in refused:
            continue
        savepoint = session.begin_nested()
        try:
            action(session, job_id)
        except GridpilotError as exc:
            savepoint.rollback()
            errors.append({"job_id": job_id, "code": status_of(exc), "detail": exc.message})
            continue
        savepoint.commit()
        done.append(job_id)
    errors.sort(key=lambda e: int(e["job_id"]))
    return done, errors


def _answer(session: Session, done: list[int], errors: list[dict[str, Any]]
            ) -> dict[str, Any]:
    return {"jobs": [{"job_id": job_id, "status": status, "minor_status": minor}
                     for job_id, status, minor in statuses_of(session, done)],
            "errors": errors}


@endpoint(bp, "POST", "/kill", tag="jobs", roles=OWNERS,
          summary="Kill many jobs: each waiting one leaves its queue, each running one is "
                  "stopped by its pilot at its next heartbeat; jobs that cannot be killed are "
                  "listed with the reason, the others are killed all the same",
          body={JSON: schemas.BULK_REQUEST},
          responses={200: ("The jobs killed, and those refused", schemas.BULK_ANSWER)})
def kill_many(call: Call) -> dict[str, Any]:
    reason = call.body.get("reason") or ""
    who = call.principal.name
    why = (f"Killed by {who}" + (f": {reason}" if reason else ""))[:255]

    def work(session: Session) -> dict[str, Any]:
        done, errors = _act_on_each(session, call.principal, call.body["job_ids"],
                                    lambda s, j: kill_job(s, j, by=who, now=call.now,
                                                          reason=why))
        return _answer(session, done, errors)

    return call.runtime.transaction(work)


@endpoint(bp, "POST", "/reschedule", tag="jobs", roles=OWNERS,
          summary="Run many jobs again from the start: each goes back through the optimizer "
                  "chain into a task queue (a job rescheduled the maximum number of times is "
                  "refused)",
          body={JSON: schemas.BULK_REQUEST},
          responses={200: ("The jobs rescheduled (status after the chain ran), and those "
                           "refused", schemas.BULK_ANSWER)})
def reschedule_many(call: Call) -> dict[str, Any]:
    who = call.principal.name
    reason = call.body.get("reason") or f"Rescheduled by {who}"
    most = call.runtime.settings.taskqueue.max_reschedules
    ctx = call.runtime.chain_context(call.now)

    def work(session: Session) -> dict[str, Any]:
        done, errors = _act_on_each(
            session, call.principal, call.body["job_ids"],
            lambda s, j: reschedule_job(s, j, by=who, now=call.now, reason=reason,
                                        max_reschedules=most, fail_when_exhausted=False))
        if done:
            optimize_received(session, ctx, limit=len(done), job_ids=done)
        return _answer(session, done, errors)

    return call.runtime.transaction(work)


@endpoint(bp, "POST", "/delete", tag="jobs", roles=OWNERS,
          summary="Delete many jobs (active ones are killed first)",
          body={JSON: schemas.BULK_REQUEST},
          responses={200: ("The jobs deleted, and those refused", schemas.BULK_ANSWER)})
def delete_many(call: Call) -> dict[str, Any]:
    who = call.principal.name

    def work(session: Session) -> dict[str, Any]:
        done, errors = _act_on_each(session, call.principal, call.body["job_ids"],
                                    lambda s, j: delete_job(s, j, by=who, now=call.now))
        return _answer(session, done, errors)

    return call.runtime.transaction(work)

