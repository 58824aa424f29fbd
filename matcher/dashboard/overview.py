"""/ui/: the VO at a glance."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flask import Response, redirect, request, url_for

from matcher.dashboard.charts import bar, line_chart
from matcher.dashboard.web import Page, bp, page, render
from matcher.problems import Problem
from taskqueue.core.states import JobStatus
from taskqueue.db.database import Session
from taskqueue.matching.limits import site_bans
from taskqueue.pilots.activity import (
    HOUR,
    MINUTE,
    activity_series,
    floor_time,
    jobs_failed_since,
    latest_snapshot,
    recent_failures,
    site_totals,
    status_series,
)

#: The time ranges the charts offer: how far back, and the tier of rows they read.
RANGES: dict[str, tuple[timedelta, int]] = {
    "6h": (timedelta(hours=6), MINUTE), "24h": (timedelta(hours=24), MINUTE),
    "7d": (timedelta(days=7), HOUR), "30d": (timedelta(days=30), HOUR)}
#: The statuses charted over time: where jobs are on their way, not the final ones.
CHARTED = ("Waiting", "Matched", "Running", "Stalled")
#: A snapshot older than this means the activity loop is not running.
STALE = timedelta(minutes=5)


def status_class(status: str) -> str:
    return f"s-{status.lower()}"


@bp.get("/")
@page()
def overview(p: Page) -> Response:
    if not p.viewer.is_operator:
        return redirect(url_for("ui.jobs"))  # type: ignore[return-value]
    chosen = request.args.get("range", "6h")
    if chosen not in RANGES:
        raise Problem(400, f"range must be one of {', '.join(RANGES)}, got {chosen!r}")
    span, period = RANGES[chosen]
    now = p.now
    since = now - span
    until = floor_time(now, period)  # the current minute or hour so far is the last point
    last_minute = floor_time(now, MINUTE) - timedelta(minutes=1)
    # The last hour in whole minutes, the same for the counters and the failures panel.
    hour_ago = floor_time(now - timedelta(hours=1), MINUTE)

    def work(session: Session) -> dict[str, Any]:
        hour = site_totals(session, p.vo, since=hour_ago)
        return {
            "snapshot": latest_snapshot(session, p.vo),
            "statuses": status_series(session, p.vo, since=since, period=period,
                                      statuses=CHARTED),
            "activity": activity_series(session, p.vo, since=since, until=until,
                                        period=period),
            "last_minute": activity_series(session, p.vo, since=last_minute,
                                           until=last_minute, period=MINUTE),
            "failures": recent_failures(session, p.vo, since=hour_ago),
            "failed_jobs_hour": jobs_failed_since(session, p.vo, since=hour_ago),
            "bans": site_bans(session, p.vo),
            "matched_hour": sum(t.matched for t in hour.values()),
            "done_hour": sum(t.done for t in hour.values()),
            "failed_hour": sum(t.failed for t in hour.values()),
        }

    data = p.runtime.transaction(work)
    snapshot = data["snapshot"]
    activity = data["activity"]
    unit = "minute" if period == MINUTE else "hour"
    last_matched = data["last_minute"].lines["matched"][0]
    groups = sorted(snapshot.waiting_by_group.items(), key=lambda kv: (-kv[1], kv[0]))
    most = max((n for _, n in groups), default=0)
    failures = data["failures"]
    most_failed = max((n for _, n in failures), default=0)
    return render(
        "overview.html", viewer=p.viewer, now=now, range=chosen, ranges=list(RANGES),
        snapshot=snapshot, stale=snapshot.at is None or now - snapshot.at > STALE,
        statuses=[(s.value, snapshot.by_status.get(s.value, 0), status_class(s.value))
                  for s in JobStatus],
        total_jobs=sum(snapshot.by_status.values()),
        status_chart=line_chart(data["statuses"], title=f"Jobs by status, last {chosen}",
                                classes={s: status_class(s) for s in CHARTED},
                                start=since, end=now),
        activity_chart=line_chart(activity, title=f"Jobs matched, done and failed per {unit}",
                                  classes={"matched": "s-matched", "done": "s-done",
                                           "failed": "s-failed"}, unit=f"jobs/{unit}",
                                  start=since, end=until),
        charted=[(s, status_class(s)) for s in CHARTED], unit=unit,
        last_matched=last_matched, matched_hour=data["matched_hour"],
        done_hour=data["done_hour"], failed_hour=data["failed_hour"],
        failed_jobs_hour=data["failed_jobs_hour"],
        groups=[(g, n, bar(n / most if most else 0)) for g, n in groups],
        failures=[(reason, n, bar(n / most_failed if most_failed else 0, "bad"))
                  for reason, n in failures],
        bans=data["bans"])
