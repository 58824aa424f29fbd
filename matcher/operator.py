"""/api/v1/sitemask, /limits and /shares: what a VO's operators steer matching with. All of it
lives in the database, so every matcher process honours a change at once."""

from __future__ import annotations

import difflib
from typing import Any

from flask import Blueprint

from matcher import schemas
from matcher.api import JSON, Call, endpoint
from matcher.auth import OPERATOR
from matcher.problems import Problem
from matcher.views import iso
from taskqueue.core.settings import Settings
from taskqueue.db.database import Session
from taskqueue.db.models import SiteBan, SiteLimit
from taskqueue.matching.limits import (
    LimitSpec,
    ban_site,
    delete_limit,
    set_limit,
    site_bans,
    site_limits,
    unban_site,
)
from taskqueue.queues.shares import reset_share, set_share, share_table

bp = Blueprint("operator", __name__, url_prefix="/api/v1")
ONLY = (OPERATOR,)


def _ban(ban: SiteBan) -> dict[str, Any]:
    return {"site": ban.site, "reason": ban.reason, "banned_by": ban.banned_by,
            "banned_at": iso(ban.banned_at)}


@endpoint(bp, "GET", "/sitemask", tag="operator", roles=ONLY,
          summary="The VO's banned sites", responses={200: ("Banned sites", schemas.SITE_MASK)})
def get_mask(call: Call) -> dict[str, Any]:
    bans = call.runtime.transaction(lambda s: [_ban(b) for b in site_bans(s, call.principal.vo)])
    return {"banned": bans}


@endpoint(bp, "PUT", "/sitemask/<site>", tag="operator", roles=ONLY,
          summary="Ban a site: its pilots get no job until it is unbanned",
          body={JSON: schemas.REASON}, body_required=False,
          responses={200: ("The ban", schemas.SITE_BAN)})
def ban(call: Call, site: str) -> dict[str, Any]:
    known = call.runtime.resources().sites
    if known and site.strip() not in known:  # a typo would ban nothing and say nothing
        near = difflib.get_close_matches(site.strip(), list(known), n=3, cutoff=0.5)
        raise Problem(422, f"site {site!r} is not in the resources file, so no pilot runs there"
                      + (f"; did you mean {', '.join(near)}?" if near else
                         f"; its sites are {', '.join(sorted(known)[:20])}"))
    reason = (call.body or {}).get("reason") or "banned by an operator"
    return call.runtime.transaction(lambda s: _ban(ban_site(
        s, call.principal.vo, site, reason=reason, by=call.principal.name, now=call.now)))


@endpoint(bp, "DELETE", "/sitemask/<site>", tag="operator", roles=ONLY,
          summary="Unban a site", responses={200: ("The VO's banned sites", schemas.SITE_MASK)})
def unban(call: Call, site: str) -> dict[str, Any]:
    def work(session: Session) -> dict[str, Any]:
        unban_site(session, call.principal.vo, site)
        return {"banned": [_ban(b) for b in site_bans(session, call.principal.vo)]}

    return call.runtime.transaction(work)


def _limit(limit: SiteLimit) -> dict[str, Any]:
    return {"limit_id": limit.id, "site": limit.site, "ce": limit.ce,
            "attribute": limit.attribute, "value": limit.value,
            "max_running": limit.max_running, "matching_delay": limit.matching_delay,
            "last_matched_at": iso(limit.last_matched_at)}


@endpoint(bp, "GET", "/limits", tag="operator", roles=ONLY,
          summary="The VO's site limits", responses={200: ("Site limits", schemas.LIMIT_LIST)})
def get_limits(call: Call) -> dict[str, Any]:
    limits = call.runtime.transaction(
        lambda s: [_limit(limit) for limit in site_limits(s, call.principal.vo)])
    return {"limits": limits}


@endpoint(bp, "POST", "/limits", tag="operator", roles=ONLY,
          summary="Set a site limit: at most max_running jobs with attribute=value running at "
                  "the site (or one CE of it), and/or matching_delay seconds between two of "
                  "their matches; replaces the numbers of an existing limit on the same "
                  "site, CE, attribute and value",
          body={JSON: schemas.LIMIT_REQUEST}, responses={200: ("The limit", schemas.LIMIT)})
def post_limit(call: Call) -> dict[str, Any]:
    b = call.body
    spec = LimitSpec(site=b["site"], ce=b.get("ce", ""), attribute=b["attribute"],
                     value=b["value"], max_running=b.get("max_running"),
                     matching_delay=b.get("matching_delay"))
    return call.runtime.transaction(
        lambda s: _limit(set_limit(s, call.principal.vo, spec, now=call.now)))


@endpoint(bp, "DELETE", "/limits/<int:limit_id>", tag="operator", roles=ONLY,
          summary="Remove a site limit",
          responses={200: ("The VO's remaining limits", schemas.LIMIT_LIST)})
def remove_limit(call: Call, limit_id: int) -> dict[str, Any]:
    def work(session: Session) -> dict[str, Any]:
        delete_limit(session, call.principal.vo, limit_id)
        return {"limits": [_limit(limit) for limit in site_limits(session, call.principal.vo)]}

    return call.runtime.transaction(work)


def _shares(session: Session, settings: Settings, vo: str) -> dict[str, Any]:
    return {"default_share": settings.taskqueue.default_share,
            "shares": [{"owner_group": e.owner_group, "share": e.share, "source": e.source}
                       for e in share_table(session, settings, vo)]}


@endpoint(bp, "GET", "/shares", tag="operator", roles=ONLY,
          summary="Each owner group's fair share: set by an operator, or from the settings "
                  "file; groups not listed get the default share",
          responses={200: ("Shares", schemas.SHARE_LIST)})
def get_shares(call: Call) -> dict[str, Any]:
    return call.runtime.transaction(lambda s: _shares(s, call.runtime.settings, call.principal.vo))


@endpoint(bp, "PUT", "/shares/<group>", tag="operator", roles=ONLY,
          summary="Set an owner group's share; its task queues' priorities follow at once",
          body={JSON: schemas.SHARE_REQUEST}, responses={200: ("Shares", schemas.SHARE_LIST)})
def put_share(call: Call, group: str) -> dict[str, Any]:
    settings = call.runtime.settings

    def work(session: Session) -> dict[str, Any]:
        set_share(session, settings, call.principal.vo, group, float(call.body["share"]),
                  by=call.principal.name, now=call.now)
        return _shares(session, settings, call.principal.vo)

    return call.runtime.transaction(work)


@endpoint(bp, "DELETE", "/shares/<group>", tag="operator", roles=ONLY,
          summary="Drop an operator's share for a group: the settings file's or the default "
                  "applies again", responses={200: ("Shares", schemas.SHARE_LIST)})
def delete_share(call: Call, group: str) -> dict[str, Any]:
    settings = call.runtime.settings

    def work(session: Session) -> dict[str, Any]:
        reset_share(session, settings, call.principal.vo, group)
        return _shares(session, settings, call.principal.vo)

    return call.runtime.transaction(work)
