"""/ui/sites: each site and its queues now, and banning or unbanning a site."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from flask import Response, redirect, request, url_for

from matcher.dashboard.charts import bar
from matcher.dashboard.overview import STALE
from matcher.dashboard.web import Page, bp, page, render, safe_next
from matcher.problems import Problem
from taskqueue.db.database import Session
from taskqueue.db.models import DirectorQueue, SiteBan
from taskqueue.matching.limits import ban_site, site_bans, unban_site
from taskqueue.pilots.activity import SiteTotals, site_totals
from taskqueue.pilots.monitoring import pilots_stuck_since
from taskqueue.pilots.records import ALIVE_STATES, retry_queue
from taskqueue.pilots.sitestatus import (
    LimitUsage,
    QueueState,
    director_states,
    limit_usage,
    queue_states,
)

#: Longest site name (the column's) and reason accepted from the forms.
MAX_SITE, MAX_REASON = 128, 255
#: A CE that has held waiting jobs and run none for this long is flagged: it accepts jobs
#: and does not start them.
CE_IDLE_WARNING = timedelta(minutes=10)


@dataclass
class QueueRow:
    state: QueueState
    executor: str = ""
    director: DirectorQueue | None = None
    now: datetime | None = None
    #: Its pilots killed in the last hour for hanging in a CE state, by state.
    stuck: dict[str, int] = field(default_factory=dict)

    @property
    def failing(self) -> bool:
        d = self.director
        return d is not None and (d.failures > 0 or d.poll_failures > 0
                                  or d.failed_starts > 0)

    def failures(self) -> list[tuple[str, str]]:
        """What failed, each kind apart: (kind, what the page says of it)."""
        d = self.director
        if d is None:
            return []
        out = []
        if d.failures:
            out.append(("submissions", f"Submissions: {d.failures} failed in a row, last: "
                        f"{d.last_error}; {_next_try(d.skip_until, self.now)}"))
        if d.poll_failures:
            out.append(("polls", f"Polls of its CE: {d.poll_failures} failed in a row, last: "
                        f"{d.poll_error}; {_next_try(d.poll_skip_until, self.now)}, or at "
                        "its next successful poll"))
        if d.failed_starts:
            out.append(("starts", f"Pilots failing to start: {d.starts_error}"))
        return out

    @property
    def alive(self) -> int:
        return sum(self.state.pilots.alive.values())

    @property
    def ce_idle(self) -> timedelta | None:
        """How long the CE has held waiting jobs and run none, when that is long enough to
        say (``CE_IDLE_WARNING``)."""
        d = self.director
        if d is None or d.ce_idle_since is None or self.now is None:
            return None
        idle = self.now - d.ce_idle_since
        return idle if idle >= CE_IDLE_WARNING else None


def _next_try(until: datetime | None, now: datetime | None) -> str:
    if until is None or now is None or until <= now:
        return "tried again at the director's next cycle"
    wait = int((until - now).total_seconds())
    return (f"next try at {until:%H:%M:%S} UTC (in {wait // 60} min {wait % 60} s)"
            if wait >= 60 else f"next try at {until:%H:%M:%S} UTC (in {wait} s)")


@dataclass
class SiteRow:
    name: str
    queues: list[QueueRow]
    ban: SiteBan | None
    hour: SiteTotals
    day: SiteTotals
    limits: list[tuple[LimitUsage, str]]

    @property
    def running(self) -> int:
        return sum(q.state.running for q in self.queues)

    @property
    def alive(self) -> int:
        return sum(q.alive for q in self.queues)

    @property
    def last_seen(self) -> datetime | None:
        seen = [q.state.pilots.last_seen for q in self.queues if q.state.pilots.last_seen]
        return max(seen) if seen else None

    @property
    def failing(self) -> bool:
        return any(q.failing for q in self.queues)


@bp.get("/sites")
@page(operator=True)
def sites(p: Page) -> Response:
    config = p.runtime.resources()
    executors = {(q.site, q.ce, q.name): str(q.parameters(p.vo).get("Executor") or "")
                 for q in config.queues()}
    now = p.now

    def work(session: Session) -> dict[str, Any]:
        return {
            "queues": queue_states(session, p.vo),
            "limits": limit_usage(session, p.vo),
            "director": director_states(session),
            "bans": {b.site: b for b in site_bans(session, p.vo)},
            "hour": site_totals(session, p.vo, since=now - timedelta(hours=1)),
            "day": site_totals(session, p.vo, since=now - timedelta(hours=24)),
            "stuck": pilots_stuck_since(session, now - timedelta(hours=1), vo=p.vo),
        }

    data = p.runtime.transaction(work)
    rows: dict[str, list[QueueRow]] = {}
    stuck: dict[tuple[str, str, str], dict[str, int]] = {}
    for (site, ce, queue, hung_in), n in data["stuck"].items():
        stuck.setdefault((site, ce, queue), {})[hung_in] = n
    for state in data["queues"]:
        key = (state.site, state.ce, state.queue)
        rows.setdefault(state.site, []).append(
            QueueRow(state, executors.get(key, ""), data["director"].get(key), now,
                     stuck.get(key, {})))
    for site in list(data["bans"]) + [u.limit.site for u in data["limits"]]:
        rows.setdefault(site, [])
    table = []
    for name in sorted(rows, key=lambda s: (s not in data["bans"], s)):
        limits = [(u, bar(u.fill or 0, "bad" if (u.fill or 0) >= 1 else ""))
                  for u in data["limits"] if u.limit.site == name]
        table.append(SiteRow(name, rows[name], data["bans"].get(name),
                             data["hour"].get(name, SiteTotals()),
                             data["day"].get(name, SiteTotals()), limits))
    taken = min((s.at for s in data["queues"]), default=None)
    return render("sites.html", viewer=p.viewer, now=now, sites=table,
                  banned=len(data["bans"]), failing=sum(1 for s in table if s.failing),
                  alive_states=ALIVE_STATES, no_site=data["hour"].get(""), taken=taken,
                  stale=taken is None or now - taken > STALE)


def _site_name(site: str) -> str:
    if not site.strip() or len(site) > MAX_SITE or "\x00" in site:
        raise Problem(422, f"a site name is 1 to {MAX_SITE} characters long")
    return site


@bp.route("/sites/<path:site>/ban", methods=["GET", "POST"])
@page(operator=True)
def ban(p: Page, site: str) -> Response:
    site = _site_name(site)
    back = safe_next(request.values.get("next") or url_for("ui.sites"))
    if request.method == "GET":
        return render("confirm.html", viewer=p.viewer, title=f"Ban {site}?",
                      action=url_for("ui.ban", site=site), back=back, button="Ban the site",
                      danger=True, reason_label="Why (shown to other operators)",
                      text=f"While {site} is banned, its pilots get no job of VO {p.vo}. "
                           "Jobs already running there go on.")
    reason = (request.form.get("reason") or "").strip()[:MAX_REASON] or "banned by an operator"
    p.runtime.transaction(lambda s: ban_site(s, p.vo, site, reason=reason,
                                             by=p.viewer.principal.name, now=p.now))
    return redirect(back)  # type: ignore[return-value]


@bp.route("/sites/<path:site>/unban", methods=["GET", "POST"])
@page(operator=True)
def unban(p: Page, site: str) -> Response:
    site = _site_name(site)
    back = safe_next(request.values.get("next") or url_for("ui.sites"))
    if request.method == "GET":
        return render("confirm.html", viewer=p.viewer, title=f"Unban {site}?",
                      action=url_for("ui.unban", site=site), back=back,
                      button="Unban the site", danger=False, reason_label=None,
                      text=f"Pilots at {site} get jobs of VO {p.vo} again at their next "
                           "request.")
    p.runtime.transaction(lambda s: unban_site(s, p.vo, site))
    return redirect(back)  # type: ignore[return-value]


@bp.post("/sites/retry")
@page(operator=True)
def retry(p: Page) -> Response:
    """The director tries a queue again at its next cycle, whatever failed (the same as
    ``gridpilot director retry``)."""
    parts = (request.form.get("queue") or "").split("/")
    if len(parts) != 3 or not all(part.strip() for part in parts) or any(
            len(part) > MAX_REASON or "\x00" in part for part in parts):
        raise Problem(422, "a queue is SITE/CE/QUEUE, as this page names it")
    site, ce, queue = parts
    p.runtime.transaction(lambda s: retry_queue(s, site, ce, queue,
                                                by=p.viewer.principal.name, now=p.now))
    back = safe_next(request.values.get("next") or url_for("ui.sites"))
    return redirect(back)  # type: ignore[return-value]
