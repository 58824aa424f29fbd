"""The operators' controls on matching: the site mask, and site limits.

A banned site's pilots get no job. A site limit holds back the jobs with one attribute value
(a job type or an owner group) at a site, or at one CE of it: at most ``max_running`` of them
Matched or running at once, and at least ``matching_delay`` seconds between two of their
matches. Everything lives in the database, so every matcher process honours the same limits.

Exactly-at-the-limit under concurrency. A claim for a site with limits first locks the site's
limit rows (``FOR UPDATE``, in id order), then counts, then claims: two matcher processes
serving the same site take turns for that instant, so neither can push a count past its
maximum. Sites without limits pay one small indexed read and take no lock.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    CompoundSelect,
    Text,
    any_,
    bindparam,
    exists,
    func,
    literal_column,
    select,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from taskqueue.core.errors import InvalidInputError, NotFoundError
from taskqueue.core.resources import Resource
from taskqueue.core.states import JobStatus
from taskqueue.db.models import Job, SiteBan, SiteLimit
from taskqueue.matching.claim import (
    NO_EXCLUSIONS,
    Claim,
    Exclusions,
    ExpressionCheck,
    claim_jobs,
    matching_queues,
)

#: Job attributes a site limit may hold back (the task-queue columns the matcher filters on).
LIMIT_ATTRIBUTES: dict[str, ColumnElement[str]] = {
    "job_type": Job.__table__.c.job_type,
    "owner_group": Job.__table__.c.owner_group,
}
#: Statuses in which a job counts against a running limit.
RUNNING_STATES: tuple[str, ...] = tuple(s.value for s in (
    JobStatus.MATCHED, JobStatus.RUNNING, JobStatus.STALLED, JobStatus.COMPLETING))

#: Why a match found nothing.
NO_MATCH_SITE_BANNED = "site_banned"
NO_MATCH_LIMITS = "held_by_limits"
NO_MATCH_NO_JOB = "no_matching_job"
#: The pilot must stop as a whole (taskqueue.pilots.records.pilot_stop_reason): it gets no job.
NO_MATCH_PILOT_KILLED = "pilot_killed"


# -- the site mask ------------------------------------------------------------------------

def ban_site(session: Session, vo: str, site: str, *, reason: str, by: str,
             now: datetime) -> SiteBan:
    """Ban ``site`` for the VO's pilots (again, with a new reason, if it already is)."""
    site = site.strip()
    if not site:
        raise InvalidInputError("a site name must not be empty")
    ban = session.get(SiteBan, (vo, site), with_for_update=True)
    if ban is None:
        ban = SiteBan(vo=vo, site=site, reason=reason, banned_by=by, banned_at=now)
        session.add(ban)
    else:
        ban.reason, ban.banned_by, ban.banned_at = reason, by, now
    session.flush()
    return ban


def unban_site(session: Session, vo: str, site: str) -> None:
    ban = session.get(SiteBan, (vo, site), with_for_update=True)
    if ban is None:
        raise NotFoundError(f"site {site} is not banned for VO {vo}")
    session.delete(ban)
    session.flush()


def site_bans(session: Session, vo: str) -> list[SiteBan]:
    return list(session.scalars(select(SiteBan).where(SiteBan.vo == vo).order_by(SiteBan.site)))


def banned_among(session: Session, vo: str, sites: frozenset[str]) -> frozenset[str]:
    """Which of ``sites`` are banned for the VO."""
    if not sites:
        return frozenset()
    return frozenset(session.scalars(
        select(SiteBan.site).where(SiteBan.vo == vo, SiteBan.site.in_(sorted(sites)))))


# -- site limits ----------------------------------------------------------------------------

@dataclass(frozen=True)
class LimitSpec:
    """What an operator asks for: ``ce`` "" means every CE of the site."""

    site: str
    attribute: str
    value: str
    ce: str = ""
    max_running: int | None = None
    matching_delay: int | None = None

    def __post_init__(self) -> None:
        if self.attribute not in LIMIT_ATTRIBUTES:
            raise InvalidInputError(
                f"a site limit's attribute must be one of {', '.join(sorted(LIMIT_ATTRIBUTES))}, "
                f"got {self.attribute!r}")
        if not self.site.strip() or not self.value.strip():
            raise InvalidInputError("a site limit needs a site and a value")
        if self.max_running is None and self.matching_delay is None:
            raise InvalidInputError(
                "a site limit needs max_running, matching_delay or both")
        for name in ("max_running", "matching_delay"):
            number = getattr(self, name)
            if number is not None and number < 0:
                raise InvalidInputError(f"{name} must not be negative, got {number}")


def set_limit(session: Session, vo: str, spec: LimitSpec, *, now: datetime) -> SiteLimit:
    """Create the limit, or replace the numbers of the one with the same site, CE, attribute
    and value."""
    limit = session.scalars(
        select(SiteLimit).where(SiteLimit.vo == vo, SiteLimit.site == spec.site,
                                SiteLimit.ce == spec.ce, SiteLimit.attribute == spec.attribute,
                                SiteLimit.value == spec.value).with_for_update()
    ).one_or_none()
    if limit is None:
        limit = SiteLimit(vo=vo, site=spec.site, ce=spec.ce, attribute=spec.attribute,
                          value=spec.value, last_matched_at=None)
        session.add(limit)
    limit.max_running, limit.matching_delay = spec.max_running, spec.matching_delay
    limit.updated_at = now
    session.flush()
    return limit


def delete_limit(session: Session, vo: str, limit_id: int) -> None:
    limit = session.scalars(select(SiteLimit).where(SiteLimit.id == limit_id,
                                                    SiteLimit.vo == vo)).one_or_none()
    if limit is None:
        raise NotFoundError(f"site limit {limit_id} does not exist for VO {vo}")
    session.delete(limit)
    session.flush()


def site_limits(session: Session, vo: str) -> list[SiteLimit]:
    return list(session.scalars(
        select(SiteLimit).where(SiteLimit.vo == vo)
        .order_by(SiteLimit.site, SiteLimit.ce, SiteLimit.attribute, SiteLimit.value)))


@dataclass
class _Gate:
    """The limits in force for one claim: locked rows and the counts they allow."""

    limits: list[SiteLimit]
    running: dict[int, int] = field(default_factory=dict)

    def exclusions(self, now: datetime) -> Exclusions:
        held: dict[str, set[str]] = {name: set() for name in LIMIT_ATTRIBUTES}
        for limit in self.limits:
            full = (limit.max_running is not None
                    and self.running.get(limit.id, 0) >= limit.max_running)
            waiting = (limit.matching_delay is not None and limit.last_matched_at is not None
                       and limit.last_matched_at + timedelta(seconds=limit.matching_delay) > now)
            if full or waiting:
                held[limit.attribute].add(limit.value)
        return Exclusions(frozenset(held["job_type"]), frozenset(held["owner_group"]))

    def record(self, attributes: dict[str, str], now: datetime) -> None:
        """Count a job just matched (its job type and owner group) against the limits."""
        for limit in self.limits:
            if attributes.get(limit.attribute) == limit.value:
                self.running[limit.id] = self.running.get(limit.id, 0) + 1
                if limit.matching_delay is not None:
                    limit.last_matched_at = now


_bans, _limits = SiteBan.__table__.c, SiteLimit.__table__.c


@functools.cache
def _site_controls_statement(dialect: str) -> CompoundSelect[Any]:
    """One round trip for the common case: the pilot's banned sites, and whether its site has
    limits at all (only then are they locked and counted). Lists are arrays on PostgreSQL
    (one parameter, no statement rewriting per call)."""
    def among(column: ColumnElement[str], name: str) -> ColumnElement[bool]:
        if dialect == "postgresql":
            return column == any_(bindparam(name, type_=ARRAY(Text())))
        return column.in_(bindparam(name, expanding=True))

    return union_all(
        select(_bans.site).where(_bans.vo == bindparam("vo"), among(_bans.site, "sites")),
        select(literal_column("NULL")).where(
            exists().where(_limits.vo == bindparam("vo"), _limits.site == bindparam("site"),
                           among(_limits.ce, "ces"))),
    )


def _site_controls(session: Session, resource: Resource) -> tuple[frozenset[str], bool]:
    """The resource's banned sites, and whether limits apply to its site."""
    if not resource.site:
        return frozenset(), False
    site = resource.site_for_job
    conn = session.connection()
    rows = conn.execute(_site_controls_statement(conn.dialect.name), {
        "vo": resource.vo, "sites": sorted(resource.site), "site": site or "",
        "ces": ["", resource.ce] if resource.ce else [""]}).scalars().all()
    return frozenset(r for r in rows if r is not None), site is not None and None in rows


def _lock_gate(session: Session, resource: Resource) -> _Gate:
    site = resource.site_for_job
    if site is None:  # limits are per site: a pilot naming several sites or none has none
        return _Gate([])
    ces = ["", resource.ce] if resource.ce else [""]
    limits = list(session.scalars(
        select(SiteLimit).where(SiteLimit.vo == resource.vo, SiteLimit.site == site,
                                SiteLimit.ce.in_(ces))
        .order_by(SiteLimit.id).with_for_update()))
    gate = _Gate(limits)
    for limit in limits:
        if limit.max_running is None:
            continue
        column = LIMIT_ATTRIBUTES[limit.attribute]
        jobs = Job.__table__.c
        stmt = select(func.count()).select_from(Job.__table__).where(
            jobs.site == site, jobs.status.in_(RUNNING_STATES), column == limit.value)
        if limit.ce:
            stmt = stmt.where(jobs.ce == limit.ce)
        gate.running[limit.id] = session.execute(stmt).scalar_one()
    return gate


@dataclass(frozen=True)
class MatchOutcome:
    claims: list[Claim]
    #: Set when no job was claimed: one of the NO_MATCH_* codes, and a sentence.
    reason: str | None = None
    detail: str = ""


def claim_for_pilot(session: Session, resource: Resource, *, now: datetime, count: int = 1,
                    rng: random.Random | None = None,
                    expression_check: ExpressionCheck | None = None) -> MatchOutcome:
    """Claim up to ``count`` jobs for a pilot, honouring the site mask and the site limits.

    When nothing is claimed, the outcome says why: the pilot's site is banned, the jobs it
    could run are held back by limits, or no job it could run is waiting.
    """
    sites = resource.site
    banned, has_limits = _site_controls(session, resource)
    if banned:
        assert sites is not None
        if banned >= sites:
            return MatchOutcome([], NO_MATCH_SITE_BANNED,
                                f"site {', '.join(sorted(banned))} is banned for VO "
                                f"{resource.vo}")
        resource = _without_sites(resource, banned)
    # Banned sites taken out may leave one site, whose limits the first query did not ask for.
    gate = _lock_gate(session, resource) if has_limits or banned else _Gate([])
    if not gate.limits:
        claims = claim_jobs(session, resource, now=now, count=count, rng=rng,
                            expression_check=expression_check)
    else:
        claims = _claim_gated(session, resource, gate, now=now, count=count, rng=rng,
                              expression_check=expression_check)
    if claims:
        return MatchOutcome(claims)
    if gate.limits and gate.exclusions(now) and matching_queues(
            session, resource, expression_check):
        return MatchOutcome([], NO_MATCH_LIMITS,
                            "jobs this resource could run are waiting, but the site's limits "
                            "hold them back for now")
    return MatchOutcome([], NO_MATCH_NO_JOB, "no waiting job matches this resource")


def _claim_gated(session: Session, resource: Resource, gate: _Gate, *, now: datetime,
                 count: int, rng: random.Random | None,
                 expression_check: ExpressionCheck | None) -> list[Claim]:
    """Claim one job at a time, re-deriving what the limits hold back after each."""
    claims: list[Claim] = []
    while len(claims) < count:
        found = claim_jobs(session, resource, now=now, count=1, rng=rng,
                           expression_check=expression_check,
                           exclusions=gate.exclusions(now) or NO_EXCLUSIONS)
        if not found:
            break
        claims.extend(found)
        row = session.execute(select(Job.job_type, Job.owner_group)
                              .where(Job.id == found[0].job_id)).one()
        gate.record({"job_type": row.job_type, "owner_group": row.owner_group}, now)
    session.flush()  # the matching delays' new last_matched_at
    return claims


def _without_sites(resource: Resource, banned: frozenset[str]) -> Resource:
    assert resource.site is not None
    return replace(resource, site=resource.site - banned)

