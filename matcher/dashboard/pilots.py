"""/ui/pilots and /ui/pilots/<reference>: pilots per queue and status, a pilot's record, its
jobs, what it last said and its log; killing it through its compute element (behind a
confirmation)."""

from __future__ import annotations

from typing import Any

from flask import Response, redirect, request, url_for

from matcher.dashboard.overview import status_class
from matcher.dashboard.taskqueues import int_arg, text_arg
from matcher.dashboard.web import Page, bp, page, query_url, render
from matcher.pilots import read_log
from matcher.problems import Problem
from taskqueue.core.errors import ConflictError, NotFoundError
from taskqueue.db.database import Session
from taskqueue.db.models import DirectorQueue
from taskqueue.pilots.pilotlogs import request_kill
from taskqueue.pilots.records import (
    ALIVE_STATES,
    FINAL_PILOT_STATES,
    PILOT_STATES,
    PilotFilter,
    find_pilots,
    last_pilot_report,
    pilot_of_vo,
    runs_of_pilot,
)
from taskqueue.pilots.sitestatus import queue_states

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
        session.expunge(found)
        return {"pilot": found, "jobs": runs_of_pilot(session, p.vo, reference),
                "report": last_pilot_report(session, p.vo, reference),
                "director": session.get(DirectorQueue, (found.site, found.ce, found.queue))}

    data = p.runtime.transaction(work)
    found = data["pilot"]
    jobs = data["jobs"]
    beats = [j.heartbeat_at for j in jobs if j.heartbeat_at is not None]
    try:
        log, no_log = read_log(p.runtime, found), ""
    except (NotFoundError, ConflictError) as exc:
        log, no_log = None, str(exc)
    return render("pilot.html", viewer=p.viewer, pilot=found, jobs=jobs,
                  director=data["director"], last_beat=max(beats) if beats else None,
                  report=data["report"], log=log, no_log=no_log,
                  can_kill=found.kill_requested_by is None and (
                      found.status in ALIVE_STATES or found.heard_after_end_at is not None),
                  ended=found.status in FINAL_PILOT_STATES,
                  done=request.args.get("done", ""), status_class=status_class)


@bp.route("/pilot-kill/<path:reference>", methods=["GET", "POST"])
@page(operator=True)
def pilot_kill(p: Page, reference: str) -> Response:
    if len(reference) > 255 or "\x00" in reference:
        raise Problem(404, "no pilot has such a reference")
    back = url_for("ui.pilot", reference=reference)
    if request.method == "GET":
        found = p.runtime.transaction(lambda s: pilot_of_vo(s, p.vo, reference))
        return render("confirm.html", viewer=p.viewer, title=f"Kill pilot {reference}?",
                      action=url_for("ui.pilot_kill", reference=reference), back=back,
                      button="Kill", danger=True, reason_label="",
                      text=f"Pilot {reference} ({found.status} at {found.site} / {found.ce}) "
                           "gets no job from now on and is told to stop at its next word to "
                           "the matcher; it hands the jobs it runs back for rescheduling"
                           + (", and is killed through its compute element at the site "
                              "director's next turn." if found.native_id else "."))
    principal = p.viewer.principal
    p.runtime.transaction(lambda s: request_kill(s, p.vo, reference, by=principal.subject,
                                                 now=p.now))
    return redirect(f"{back}?done=kill")  # type: ignore[return-value]
