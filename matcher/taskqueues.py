"""/api/v1/taskqueues: the task queues with their counts and priorities, which of them a
resource could serve, and why a job can or cannot run somewhere."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from matcher import schemas
from matcher.access import accessible_job
from matcher.api import JSON, Call, Param, endpoint
from matcher.auth import OPERATOR, PILOT, USER
from matcher.pilots import pilot_resource
from matcher.problems import Problem
from optimizers.classads import expression_check
from optimizers.jobexplain import explain_every_queue, explain_job
from taskqueue.core.resources import parse_resource
from taskqueue.db.database import Session
from taskqueue.matching.claim import matching_queues
from taskqueue.queues.taskqueues import queue_page

bp = Blueprint("taskqueues", __name__, url_prefix="/api/v1/taskqueues")


@endpoint(bp, "GET", "", tag="taskqueues", roles=(USER, OPERATOR),
          summary="The VO's task queues, a page at a time, with their waiting jobs, priority "
                  "and definition",
          query=(Param("after", "only queues with a larger id", "integer", minimum=0),
                 Param("limit", "queues per page", "integer", minimum=1)),
          responses={200: ("A page of task queues", schemas.TASK_QUEUE_LIST)})
def list_queues(call: Call) -> dict[str, Any]:
    limit = min(call.query["limit"], call.runtime.settings.matcher.max_page_size)
    infos = call.runtime.transaction(lambda session: queue_page(
        session, call.principal.vo, after=call.query.get("after", 0), limit=limit))
    queues = []
    for info in infos:
        q = info.queue
        queues.append({
            "tq_id": q.id, "vo": q.vo, "owner_group": q.owner_group, "owner": q.owner,
            "cpu_time": q.cpu_time, "processors": q.processors, "memory": q.memory,
            "gpus": q.gpus,
            "job_type": q.job_type, "submit_pool": q.submit_pool, "expression": q.expression,
            "priority": q.priority, "active": bool(q.active), "waiting": info.waiting,
            **{label: info.values.get(label, [])
               for label in ("sites", "banned_sites", "platforms", "tags", "ces")}})
    return {"task_queues": queues,
            "next_after": queues[-1]["tq_id"] if len(queues) == limit else None}


@endpoint(bp, "POST", "/matching", tag="taskqueues", roles=(PILOT, OPERATOR),
          summary="The non-empty task queues a resource description could be served from, "
                  "with their waiting jobs",
          body={JSON: schemas.MATCH_REQUEST},
          responses={200: ("Matching task queues", schemas.MATCHING_QUEUES)})
def matching(call: Call) -> dict[str, Any]:
    data = call.body["resource"]
    resource = (pilot_resource(call.principal, data) if call.principal.role == PILOT
                else parse_resource(data))
    if resource.vo != call.principal.vo:
        raise Problem(403, f"this token is for VO {call.principal.vo}, not {resource.vo}")
    found = call.runtime.transaction(
        lambda session: matching_queues(session, resource, expression_check(resource)))
    return {"task_queues": [{"tq_id": q.tq_id, "priority": q.priority, "waiting": q.waiting}
                            for q in found],
            "waiting": sum(q.waiting for q in found)}


@endpoint(bp, "POST", "/explain", tag="taskqueues", roles=(USER, OPERATOR),
          summary="Explain: for a job and a queue (SITE/CE/QUEUE) or a resource description, "
                  "each matching rule and whether it holds; with neither, every configured "
                  "queue and the rules that fail there",
          body={JSON: schemas.EXPLAIN_REQUEST},
          responses={200: ("Each rule, and whether the job can run there",
                           schemas.EXPLANATION)})
def explain(call: Call) -> dict[str, Any]:
    body = call.body
    if "queue" in body and "resource" in body:
        raise Problem(422, "give body.queue (SITE/CE/QUEUE), body.resource, or neither (every "
                           "configured queue), not both")
    resource = parse_resource(body["resource"]) if "resource" in body else None
    resources = call.runtime.resources()

    def work(session: Session) -> dict[str, Any]:
        job = accessible_job(session, call.principal, body["job_id"])
        if "queue" not in body and resource is None:
            verdicts = explain_every_queue(session, call.runtime.settings, resources, job,
                                           catalogue=call.runtime.catalogue())
            return {"job_id": job.id, "can_run": any(v.can_run for v in verdicts), "rules": [],
                    "queues": [{"queue": v.queue, "can_run": v.can_run,
                                "failed": [{"rule": r.rule, "holds": r.holds,
                                            "detail": r.detail} for r in v.failed]}
                               for v in verdicts]}
        result = explain_job(session, call.runtime.settings, resources, job,
                             queue=body.get("queue"), resource=resource,
                             catalogue=call.runtime.catalogue())
        return {"job_id": job.id, "can_run": result.can_run,
                "rules": [{"rule": r.rule, "holds": r.holds, "detail": r.detail}
                          for r in result.rules]}

    return call.runtime.transaction(work)
