"""/healthz (no token), /metrics (an operator's token) and the OpenAPI document."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from matcher import schemas
from matcher.api import Call, endpoint
from matcher.auth import OPERATOR
from matcher.openapi import document
from matcher.problems import Problem
from matcher.sandboxes import sandbox_gauges
from taskqueue.database import Session
from taskqueue.queues import waiting_counts

bp = Blueprint("service", __name__)

#: Task queues shown one by one in /metrics (the largest); the rest are summed per VO.
METRICS_QUEUES = 1000


@endpoint(bp, "GET", "/healthz", tag="service", roles=None,
          summary="Whether the service can reach its database (no token needed)",
          responses={200: ("Healthy", schemas.HEALTH), 503: ("The database is unreachable",
                                                            schemas.PROBLEM)})
def healthz(call: Call) -> dict[str, str]:
    try:
        call.runtime.transaction(lambda session: session.connection().exec_driver_sql(
            "SELECT 1").scalar_one())
    except Exception as exc:
        raise Problem(503, f"the database does not answer: {type(exc).__name__}") from exc
    return {"status": "ok", "database": "ok"}


@endpoint(bp, "GET", "/metrics", tag="service", roles=(OPERATOR,),
          summary="Prometheus metrics of every worker of this host: requests, matches, "
                  "no-matches by reason, latency, waiting jobs per task queue, and the "
                  "sandbox store's usage per VO",
          responses={200: ("Prometheus text exposition format", None)})
def metrics(call: Call) -> Response:
    def work(session: Session) -> list[tuple[str, dict[str, str], float]]:
        rows = waiting_counts(session, largest=METRICS_QUEUES)
        return [("gridpilot_waiting_jobs",
                 {"tq_id": str(r.tq_id), "vo": r.vo, "owner_group": r.owner_group,
                  "job_type": r.job_type}, r.waiting) for r in rows] + sandbox_gauges(session)

    text = call.runtime.metrics.render(call.runtime.transaction(work))
    return Response(text, mimetype="text/plain", content_type="text/plain; version=0.0.4")


@bp.get("/api/v1/openapi.json")
def openapi() -> Response:
    """The OpenAPI 3 document (public: it holds no data, and clients read it to start)."""
    return jsonify(document(current_app))
