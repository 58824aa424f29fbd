"""/ui/jobs and /ui/jobs/<id>: finding jobs, a job's history, description, explain and output,
and killing or rescheduling it (behind a confirmation)."""

from __future__ import annotations

from typing import Any

from flask import Response, redirect, request, url_for

from matcher import jobactions
from matcher.access import accessible_job
from matcher.api import MAX_ID
from matcher.dashboard.overview import status_class
from matcher.dashboard.taskqueues import int_arg, text_arg
from matcher.dashboard.web import Page, bp, page, query_url, render
from matcher.problems import Problem
from optimizers.jobexplain import explain_every_queue, explain_job
from optimizers.resources import ResourcesConfig, serves_vo
from taskqueue.core.errors import GridpilotError
from taskqueue.core.states import FINAL_STATES, JobStatus, is_allowed
from taskqueue.db.database import Session
from taskqueue.db.models import Job
from taskqueue.queues.jobs import JobFilter, find_jobs, job_history
from taskqueue.queues.taskqueues import task_queue_of

FILTERS = ("status", "owner", "owner_group", "site", "job_type", "job_name", "job_group")
STATUSES = tuple(s.value for s in JobStatus)
MAX_REASON = 200


@bp.get("/jobs")
@page()
def jobs(p: Page) -> Response:
    jump = int_arg("id")
    if jump is not None:
        return redirect(url_for("ui.job", job_id=min(jump, MAX_ID)))  # type: ignore[return-value]
    args = {name: text_arg(name, 255) for name in FILTERS}
    if args["status"] is not None:  # in any letter case
        status = {s.lower(): s for s in STATUSES}.get(args["status"].lower())
        if status is None:
            raise Problem(400, f"status must be one of {', '.join(STATUSES)}")
        args["status"] = status
    if not p.viewer.is_operator:
        args["owner"] = p.viewer.principal.subject  # a user sees their own jobs only
    before = int_arg("before")
    limit = p.page_size
    which = JobFilter(p.vo, status=args["status"], site=args["site"], owner=args["owner"],
                      owner_group=args["owner_group"], job_type=args["job_type"],
                      job_name=args["job_name"], job_group=args["job_group"])
    rows = p.runtime.transaction(lambda s: find_jobs(
        s, which, before=min(before or MAX_ID, MAX_ID), limit=limit))
    shown = {k: v for k, v in args.items() if p.viewer.is_operator or k != "owner"}
    return render("jobs.html", viewer=p.viewer, jobs=rows, args=shown, statuses=STATUSES,
                  status_class=status_class,
                  next_url=query_url("ui.jobs", shown, before=rows[-1].id)
                  if len(rows) == limit else None,
                  first_url=query_url("ui.jobs", shown) if before else None)


@bp.get("/jobs/<int:job_id>")
@page()
def job(p: Page, job_id: int) -> Response:
    queue = text_arg("explain", 600)
    resources = p.runtime.resources()
    serves = serves_vo(p.vo)
    queues = [f"{q.site}/{q.ce}/{q.name}" for q in resources.queues() if serves(q)]

    def work(session: Session) -> dict[str, Any]:
        found = accessible_job(session, p.viewer.principal, job_id)
        explanation = None
        if queue:
            explanation = explain_job(session, p.runtime.settings, resources, found,
                                      queue=queue, catalogue=p.runtime.catalogue())
        tq_id = task_queue_of(session, job_id)
        return {"job": found, "history": job_history(session, job_id),
                "explanation": explanation, "tq_id": tq_id,
                "preselected": queue or _first_able(session, p, resources, found)}

    data = p.runtime.transaction(work)
    found = data["job"]
    status = JobStatus(found.status)
    return render("job.html", viewer=p.viewer, job=found, history=data["history"],
                  explanation=data["explanation"], explained=queue or "", queues=queues,
                  preselected=data["preselected"],
                  tq_id=data["tq_id"], status_class=status_class,
                  can_kill=status not in FINAL_STATES,
                  can_reschedule=is_allowed(status, JobStatus.RESCHEDULED),
                  done=request.args.get("done", ""))


def _first_able(session: Session, p: Page, resources: ResourcesConfig, job: Job) -> str:
    """The first configured queue that could run ``job`` (SITE/CE/QUEUE), "" when none can
    (or its description cannot be read): what the explain form offers first."""
    try:
        verdicts = explain_every_queue(session, p.runtime.settings, resources, job,
                                       catalogue=p.runtime.catalogue())
    except GridpilotError:
        return ""
    return next((v.queue for v in verdicts if v.can_run), "")


ACTIONS = {"kill": ("Kill", "Kill the job"), "reschedule": ("Reschedule", "Reschedule the job")}


@bp.route("/jobs/<int:job_id>/<any(kill, reschedule):action>", methods=["GET", "POST"])
@page()
def job_action(p: Page, job_id: int, action: str) -> Response:
    verb, button = ACTIONS[action]
    if request.method == "GET":
        found = p.runtime.transaction(
            lambda s: accessible_job(s, p.viewer.principal, job_id))
        text = (f"Job {found.id} ({found.owner}, {found.status}) is stopped: a waiting job "
                "leaves its task queue, a running one is killed by its pilot at its next "
                "heartbeat." if action == "kill" else
                f"Job {found.id} ({found.owner}, {found.status}) goes back through the "
                "optimizer chain and waits for a pilot again; it has been rescheduled "
                f"{found.reschedule_count} time(s).")
        return render("confirm.html", viewer=p.viewer, title=f"{verb} job {found.id}?",
                      action=url_for("ui.job_action", job_id=job_id, action=action),
                      back=url_for("ui.job", job_id=job_id), button=button,
                      danger=action == "kill", reason_label="Reason (kept in its history)",
                      text=text)
    reason = (request.form.get("reason") or "").strip()[:MAX_REASON]
    principal = p.viewer.principal
    if action == "kill":
        p.runtime.transaction(lambda s: jobactions.kill(s, principal, job_id, now=p.now,
                                                        reason=reason))
    else:
        p.runtime.transaction(lambda s: jobactions.reschedule(
            s, p.runtime, principal, job_id, now=p.now, reason=reason))
    return redirect(url_for("ui.job", job_id=job_id, done=action))  # type: ignore[return-value]
