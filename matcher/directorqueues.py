"""/api/v1/director/queues: what the site director remembers of each queue of the VO (its
failed submissions and failed polls of its CE, each with its last error and next try), and an
operator's "retry now" for one, as ``gridpilot director retry`` and the sites page's button."""

from __future__ import annotations

from typing import Any

from flask import Blueprint

from matcher import schemas
from matcher.api import Call, endpoint
from matcher.auth import OPERATOR
from matcher.problems import Problem
from matcher.views import iso
from optimizers.resources import serves_vo
from taskqueue.db.database import Session
from taskqueue.db.models import DirectorQueue
from taskqueue.pilots.records import retry_queue
from taskqueue.pilots.sitestatus import director_states

bp = Blueprint("directorqueues", __name__, url_prefix="/api/v1/director")
ONLY = (OPERATOR,)


def _state(d: DirectorQueue) -> dict[str, Any]:
    return {"site": d.site, "ce": d.ce, "queue": d.queue,
            "failures": d.failures, "skip_until": iso(d.skip_until),
            "last_error": d.last_error, "poll_failures": d.poll_failures,
            "poll_skip_until": iso(d.poll_skip_until), "poll_error": d.poll_error,
            "last_cycle_at": iso(d.last_cycle_at),
            "retry_requested_at": iso(d.retry_requested_at),
            "retry_requested_by": d.retry_requested_by}


def _vo_queues(call: Call) -> set[tuple[str, str, str]]:
    """The queues of the resources configuration that serve the caller's VO."""
    select = serves_vo(call.principal.vo)
    return {(q.site, q.ce, q.name) for q in call.runtime.resources().queues() if select(q)}


@endpoint(bp, "GET", "/queues", tag="operator", roles=ONLY,
          summary="The site director's record of each queue of the VO",
          responses={200: ("Director queues", schemas.DIRECTOR_QUEUE_LIST)})
def list_director_queues(call: Call) -> dict[str, Any]:
    mine = _vo_queues(call)
    states = call.runtime.transaction(director_states)
    return {"queues": [_state(d) for key, d in sorted(states.items()) if key in mine]}


@endpoint(bp, "POST", "/queues/<site>/<ce>/<queue>/retry", tag="operator", roles=ONLY,
          summary="Try a queue again at the director's next cycle, whatever failed",
          responses={200: ("The queue's record", schemas.DIRECTOR_QUEUE),
                     404: ("Not a queue of the VO, or never served", schemas.PROBLEM)})
def retry_director_queue(call: Call, site: str, ce: str, queue: str) -> dict[str, Any]:
    if (site, ce, queue) not in _vo_queues(call):
        raise Problem(404, f"{site}/{ce}/{queue} is not a queue of the resources configuration "
                      f"that serves VO {call.principal.vo}")

    def work(session: Session) -> dict[str, Any]:
        return _state(retry_queue(session, site, ce, queue, by=call.principal.name,
                                  now=call.now))

    return call.runtime.transaction(work)
