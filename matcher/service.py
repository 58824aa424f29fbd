"""/healthz (no token), /metrics (an operator's token) and the OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable

from flask import Blueprint, Response, current_app, jsonify, request

from matcher import schemas
from matcher.api import Call, endpoint
from matcher.auth import OPERATOR, authorize
from matcher.idp import IdentityProviders
from matcher.openapi import document
from matcher.problems import Problem
from matcher.runtime import Runtime
from matcher.sandboxes import sandbox_gauges
from taskqueue.core.errors import DatabaseUnavailableError
from taskqueue.db.database import Session
from taskqueue.queues.taskqueues import waiting_counts
from taskqueue.scrapes import scraper_admitted

bp = Blueprint("service", __name__)

#: Task queues shown one by one in /metrics (the largest); the rest are summed per VO.
METRICS_QUEUES = 1000
#: The WSGI environ key in which ``gridpilot serve``'s worker (gridpilot.worker) says for how
#: many seconds its request threads have had no room for another request (absent elsewhere).
REQUEST_THREADS_STUCK = "gridpilot.request_threads_stuck"


@endpoint(bp, "GET", "/healthz", tag="service", roles=None,
          summary="Whether this instance can take work: its database answers, and its "
                  "request threads have not all been held longer than [matcher] "
                  "starved_after (no token needed)",
          responses={200: ("Healthy", schemas.HEALTH),
                     503: ("The database is unreachable, or no request thread has come free "
                           "for too long", schemas.PROBLEM)})
def healthz(call: Call) -> dict[str, str]:
    starved_after = call.runtime.settings.matcher.starved_after
    stuck = float(request.environ.get(REQUEST_THREADS_STUCK, 0.0))
    if starved_after and stuck > starved_after:
        raise Problem(503, f"this worker's request threads have had no room for another "
                           f"request for {stuck:.0f} s (more than matcher.starved_after, "
                           f"{starved_after:g} s): send requests to another instance")
    # Within a second, even when the database hangs (taskqueue.db.health).
    trouble = call.runtime.health().check()
    if trouble is not None:
        raise Problem(503, trouble)
    return {"status": "ok", "database": "ok"}


#: Who may read /metrics with a token of this service (or of an identity provider).
METRICS_ROLES = (OPERATOR,)


def metrics_token_judge(secret: str, providers: IdentityProviders
                        ) -> Callable[[str], tuple[int, str] | None]:
    """How another /metrics (the agents') judges a bearer token as this one does: None for
    one it admits, else the HTTP status and why not."""
    def judge(header: str) -> tuple[int, str] | None:
        try:
            authorize(header, secret, providers, METRICS_ROLES, "GET", "/metrics")
        except Problem as exc:
            return exc.status, exc.detail
        return None

    return judge


def _scraper_admitted(runtime: Runtime) -> bool:
    """A scrape from an allowed address, or bringing the metrics token, needs no operator."""
    return scraper_admitted(runtime.settings.matcher, request.headers.get("Authorization", ""),
                            request.remote_addr)


@endpoint(bp, "GET", "/metrics", tag="service", roles=METRICS_ROLES, admit=_scraper_admitted,
          summary="Prometheus metrics of every worker of this host: requests, matches, "
                  "no-matches by reason, latency, waiting jobs per task queue, and the "
                  "sandbox store's usage per VO. For an operator's token, the metrics token "
                  "([matcher] metrics_token) or an address of [matcher] metrics_allow",
          responses={200: ("Prometheus text exposition format", None)})
def metrics(call: Call) -> Response:
    """The counts of this host's workers, and what the database holds. A database that does
    not answer (within the health check's second) is said in ``gridpilot_database_up``, and
    the rest is still answered, so that the scrape tells a dead database from a dead
    service."""
    def work(session: Session) -> list[tuple[str, dict[str, str], float]]:
        rows = waiting_counts(session, largest=METRICS_QUEUES)
        return [("gridpilot_waiting_jobs",
                 {"tq_id": str(r.tq_id), "vo": r.vo, "owner_group": r.owner_group,
                  "job_type": r.job_type}, r.waiting) for r in rows] + sandbox_gauges(session)

    gauges: list[tuple[str, dict[str, str], float]] = []
    up = call.runtime.health().check() is None
    if up:
        try:
            gauges = call.runtime.transaction(work)
        except DatabaseUnavailableError:
            up = False
    gauges.append(("gridpilot_database_up", {}, 1.0 if up else 0.0))
    text = call.runtime.metrics.render(gauges)
    return Response(text, mimetype="text/plain", content_type="text/plain; version=0.0.4")


@bp.get("/api/v1/openapi.json")
def openapi() -> Response:
    """The OpenAPI 3 document (public: it holds no data, and clients read it to start). Its
    server is the URL the client used (behind trusted proxies, the public one)."""
    return jsonify(document(current_app, request.url_root.rstrip("/") or "/"))
