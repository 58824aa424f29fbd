"""/api/v1/jobs: submit, list, inspect, kill, reschedule and delete jobs, and read their
output."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint

from matcher import jobactions, schemas
from matcher.access import accessible_job
from matcher.api import JDL, JSON, MAX_ID, Call, Param, endpoint
from matcher.auth import OPERATOR, USER
from matcher.problems import Problem
from matcher.submitsandboxes import check_inputs, input_sandboxes, link_inputs
from matcher.views import iso, job_summary
from optimizers.chain import Identity, submissions_from_text, submit
from optimizers.description import description_warnings
from taskqueue.core.states import JobStatus
from taskqueue.db.database import Session
from taskqueue.files.sandboxes import INPUT, OUTPUT, job_sandboxes
from taskqueue.queues.jobcontrol import delete_job
from taskqueue.queues.jobs import (
    JobFilter,
    count_jobs_by_status,
    find_jobs,
    job_history,
)
from taskqueue.queues.taskqueues import WAITING_MINOR_STATUS

bp = Blueprint("jobs", __name__, url_prefix="/api/v1/jobs")
OWNERS = (USER, OPERATOR)


@endpoint(bp, "POST", "", tag="jobs", roles=OWNERS,
          summary="Submit a job: one JDL (text/plain) or JSON description, a JSON list of them "
                  "(a bulk), or a parametric job; returns the new jobs' ids",
          body={JSON: schemas.SUBMIT_JSON, JDL: schemas.SUBMIT_JDL},
          responses={201: ("The jobs were stored and went through the optimizer chain",
                           schemas.SUBMITTED)})
def submit_jobs(call: Call) -> tuple[dict[str, Any], int]:
    fmt = "json" if call.media == JSON else "jdl"
    submissions = submissions_from_text(call.text, fmt)
    identity = Identity(call.principal.vo, call.principal.subject, call.principal.group)
    ctx = call.runtime.chain_context(call.now)
    inputs = input_sandboxes(submissions)

    def work(session: Session) -> list[dict[str, Any]]:
        check_inputs(session, inputs, identity)
        result = submit(session, submissions, identity, ctx)
        link_inputs(session, result.stored, inputs)
        # The chain's outcome is each job's status: no need to read the jobs back.
        outcome = {job_id: (JobStatus.WAITING.value, WAITING_MINOR_STATUS)
                   for job_id in result.waiting}
        outcome.update({job_id: (JobStatus.FAILED.value, reason[:255])
                        for job_id, reason in result.failed.items()})
        return [{"job_id": job_id, "status": status, "minor_status": minor}
                for job_id, (status, minor) in sorted(outcome.items())]

    jobs = call.runtime.transaction(work)
    warnings = description_warnings(s.description for s in submissions)
    return {"job_ids": [j["job_id"] for j in jobs], "jobs": jobs, "warnings": warnings}, 201


#: The filters of a job listing and of its summary.
FILTERS = (Param("status", "only jobs in this status", enum=tuple(s.value for s in JobStatus)),
           Param("site", "only jobs at this site"),
           Param("owner", "only this owner's jobs (operators; a user sees their own)"),
           Param("owner_group", "only this group's jobs"),
           Param("job_type", "only jobs of this type"),
           Param("job_name", "only jobs of this JobName (a trailing * matches a prefix)"),
           Param("job_group", "only jobs of this JobGroup (a trailing * matches a prefix)"),
           Param("since", "only jobs submitted at or after this time (ISO 8601, UTC unless "
                          "it says otherwise)", format="date-time"))


def job_filter(call: Call) -> JobFilter:
    """The listing's filters, held to what the caller may see: a user their own jobs."""
    q = call.query
    owner = call.principal.subject if call.principal.role == USER else q.get("owner")
    return JobFilter(call.principal.vo, status=q.get("status"), site=q.get("site"),
                     owner=owner, owner_group=q.get("owner_group"),
                     job_type=q.get("job_type"), job_name=q.get("job_name"),
                     job_group=q.get("job_group"), since=_time(q.get("since"), "since"))


def _time(text: str | None, name: str) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise Problem(400, f"query parameter {name} must be a time in ISO 8601, such as "
                           f"2026-11-23T08:00:00Z, got {text!r}") from exc
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@endpoint(bp, "GET", "", tag="jobs", roles=OWNERS,
          summary="List jobs (a user's own; an operator's whole VO) a page at a time, oldest "
                  "first (order=desc: newest first): pass the answer's next_after as 'after' "
                  "for the next page",
          query=(*FILTERS,
                 Param("order", "asc: oldest first (the default); desc: newest first",
                       enum=("asc", "desc")),
                 Param("after", "where the page starts: the next_after of the previous page",
                       "integer", minimum=0),
                 Param("limit", "jobs per page", "integer", minimum=1)),
          responses={200: ("A page of jobs", schemas.JOB_LIST)})
def list_jobs(call: Call) -> dict[str, Any]:
    q = call.query
    limit = min(q["limit"], call.runtime.settings.matcher.max_page_size)
    which = job_filter(call)
    if q.get("order") == "desc":
        page = {"before": q.get("after", MAX_ID)}
    else:
        page = {"after": q.get("after", 0)}
    rows = call.runtime.transaction(
        lambda session: find_jobs(session, which, limit=limit, **page))
    return {"jobs": [job_summary(r) for r in rows],
            "next_after": rows[-1].id if len(rows) == limit else None}


@endpoint(bp, "GET", "/summary", tag="jobs", roles=OWNERS,
          summary="How many jobs (a user's own; an operator's whole VO) are in each status, "
                  "with the listing's filters",
          query=FILTERS,
          responses={200: ("Counts by status", schemas.JOB_COUNTS)})
def summary(call: Call) -> dict[str, Any]:
    which = job_filter(call)
    counts = call.runtime.transaction(lambda session: count_jobs_by_status(session, which))
    return {"total": sum(counts.values()), "by_status": dict(sorted(counts.items()))}


@endpoint(bp, "GET", "/<int:job_id>", tag="jobs", roles=OWNERS,
          summary="A job: status, minor status, site, pilot, times, what its pilot reported, "
                  "and its status history",
          responses={200: ("The job", schemas.JOB)})
def get_job(call: Call, job_id: int) -> dict[str, Any]:
    def work(session: Session) -> dict[str, Any]:
        job = accessible_job(session, call.principal, job_id)
        history = [{"at": iso(h.at), "status": h.status, "minor_status": h.minor_status,
                    "source": h.source} for h in job_history(session, job_id)]
        return {**job_summary(job), "ce": job.ce, "pilot_reference": job.pilot_reference,
                "started_at": iso(job.started_at), "heartbeat_at": iso(job.heartbeat_at),
                "reschedule_count": job.reschedule_count, "cpu_time": job.cpu_time,
                "processors": job.processors, "memory": job.memory,
                "user_priority": job.user_priority, "submit_pool": job.submit_pool,
                "bulk_index": job.bulk_index, "cpu_used": job.cpu_used,
                "progress": job.progress, "exit_code": job.exit_code, "history": history}

    return call.runtime.transaction(work)


@endpoint(bp, "GET", "/<int:job_id>/output", tag="jobs", roles=OWNERS,
          summary="The exit code, the tail of standard output and error the job's pilot "
                  "reported, and the output sandbox it uploaded (GET /api/v1/sandboxes/{id})",
          responses={200: ("The job's output tail", schemas.JOB_OUTPUT)})
def get_output(call: Call, job_id: int) -> dict[str, Any]:
    def work(session: Session) -> dict[str, Any]:
        job = accessible_job(session, call.principal, job_id)
        outputs = job_sandboxes(session, job_id, OUTPUT)
        return {"job_id": job.id, "status": job.status, "exit_code": job.exit_code,
                "output_tail": job.output_tail,
                "output_sandbox": outputs[-1] if outputs else None,
                "input_sandboxes": job_sandboxes(session, job_id, INPUT)}

    return call.runtime.transaction(work)


@endpoint(bp, "POST", "/<int:job_id>/kill", tag="jobs", roles=OWNERS,
          summary="Kill a job: a waiting job leaves its queue; a running one is stopped by its "
                  "pilot at its next heartbeat",
          body={JSON: schemas.REASON}, body_required=False,
          responses={200: ("The job is Killed", schemas.JOB_STATUS)})
def kill(call: Call, job_id: int) -> dict[str, Any]:
    reason = (call.body or {}).get("reason") or ""
    return call.runtime.transaction(lambda session: jobactions.kill(
        session, call.principal, job_id, now=call.now, reason=reason))


@endpoint(bp, "POST", "/<int:job_id>/reschedule", tag="jobs", roles=OWNERS,
          summary="Run a job again from the start: it goes back through the optimizer chain "
                  "into a task queue (refused once it was rescheduled the maximum number of "
                  "times)",
          body={JSON: schemas.REASON}, body_required=False,
          responses={200: ("The job's status after the chain ran", schemas.JOB_STATUS)})
def reschedule(call: Call, job_id: int) -> dict[str, Any]:
    reason = (call.body or {}).get("reason") or ""
    return call.runtime.transaction(lambda session: jobactions.reschedule(
        session, call.runtime, call.principal, job_id, now=call.now, reason=reason))


@endpoint(bp, "DELETE", "/<int:job_id>", tag="jobs", roles=OWNERS,
          summary="Delete a job (an active job is killed first)",
          responses={200: ("The job is Deleted", schemas.JOB_STATUS)})
def delete(call: Call, job_id: int) -> dict[str, Any]:
    def work(session: Session) -> dict[str, Any]:
        accessible_job(session, call.principal, job_id)
        delete_job(session, job_id, by=call.principal.name, now=call.now)
        return jobactions.job_status(session, job_id)

    return call.runtime.transaction(work)
