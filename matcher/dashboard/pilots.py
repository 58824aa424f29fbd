"""/ui/pilots and /ui/pilots/<reference>: pilots per queue and status, a pilot's record, its
jobs and what it last said."""

from __future__ import annotations

from typing import Any

from flask import Response

from matcher.dashboard.overview import status_class
from matcher.dashboard.taskqueues import int_arg, text_arg
from matcher.dashboard.web import Page, bp, page, query_url, render
from matcher.problems import Problem
from taskqueue.database import Session
from taskqueue.models import DirectorQueue
from taskqueue.pilots import (
    ALIVE_STATES,
    PILOT_STATES,
    PilotFilter,
    find_pilots,
    jobs_of_pilot,
    last_pilot_report,
    pilot_of_vo,
)
from taskqueue.sitestatus import queue_states

FILTERS = ("site", "ce", "queue", "status")
LIMITS = {"site": 128, "ce": 255, "queue": 128, "status": 32}


@bp.get("/pilots")
@page(operator=True)
def pilots(p: Page) -> Response:
    args = {name: text_arg(name, LIMITS[name]) for name in FILTERS}
    if args["status"] is not None and args["status"] not in PILOT_STATES:
        raise Problem(400, f"status must be one of {', '.join(PILOT_STATES)}")
    before = int_arg("before")
    limit = p.page_size

    def work(session: Session) -> dict[str, Any]:
        return {"counts": queue_states(session, p.vo, site=args["site"], ce=args["ce"],
                                       queue=args["queue"]),
                "pilots": find_pilots(session, PilotFilter(p.vo, **args), before=before,
                                      limit=limit)}

    data = p.runtime.transaction(work)
    rows = data["pilots"]
    counts = [((q.site, q.ce, q.queue), q.pilots) for q in data["counts"]
              if q.pilots.alive or q.pilots.ended or q.pilots.last_seen]
    totals = {s: sum({**c.alive, **c.ended}.get(s, 0) for _, c in counts)
              for s in PILOT_STATES}
    taken = min((q.at for q in data["counts"]), default=None)
    return render("pilots.html", viewer=p.viewer, counts=counts, states=PILOT_STATES,
                  taken=taken,
                  alive_states=ALIVE_STATES, totals=totals, pilots=rows, args=args,
                  status_class=status_class,
                  next_url=query_url("ui.pilots", args, before=rows[-1].id)
                  if len(rows) == limit else None,
                  first_url=query_url("ui.pilots", args) if before else None)


@bp.get("/pilots/<path:reference>")
@page(operator=True)
def pilot(p: Page, reference: str) -> Response:
    if len(reference) > 255 or "\x00" in reference:
        raise Problem(404, "no pilot has such a reference")

    def work(session: Session) -> dict[str, Any]:
        found = pilot_of_vo(session, p.vo, reference)
        return {"pilot": found, "jobs": jobs_of_pilot(session, p.vo, reference),
                "report": last_pilot_report(session, p.vo, reference),
                "director": session.get(DirectorQueue, (found.site, found.ce, found.queue))}

    data = p.runtime.transaction(work)
    jobs = data["jobs"]
    beats = [j.heartbeat_at for j in jobs if j.heartbeat_at is not None]
    return render("pilot.html", viewer=p.viewer, pilot=data["pilot"], jobs=jobs,
                  director=data["director"], last_beat=max(beats) if beats else None,
                  report=data["report"],
                  status_class=status_class)
