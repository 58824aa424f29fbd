"""Which task queues the pilots of many resources could be served from, matched in one pass.

The watchdog (which task queues no configured queue can run) and the activity loop (how many
waiting jobs each configured queue's pilots could run) ask this for every configured queue of
the grid. Matching each resource on its own costs one query over every task queue: 11 ms
against 10,000 task queues, so 3,000 configured queues took over 30 s a turn. But the
configured queues' descriptions differ mostly in their site and CE. So the resources are
grouped by the rest of their description (their *terms*); each group is matched once in SQL,
with the matcher's own conditions but the site and CE ones; and the site and CE rules are
applied per resource here, to the few task queues they can change:

- a task queue that names no site, bans none, names no CE and carries no ClassAd expression is
  reached by every resource of its group (:attr:`Reach.shared`: one tuple for all of them);
- one that names sites is looked at only for the resources at one of those sites;
- any other (bans sites, names CEs, or carries an expression) is looked at for each resource.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from taskqueue.core.resources import Resource
from taskqueue.db.models import (
    task_queues_table,
    tq_banned_sites_table,
    tq_ces_table,
    tq_sites_table,
)
from taskqueue.matching.claim import ExpressionCheck, condition_parameters, queue_conditions
from taskqueue.matching.rules import ce_allowed, site_allowed

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Reach:
    """The task queues one resource could be served from, empty or not: ``shared`` (the same
    tuple for every resource of its group, so that a sum over it is taken once) and ``own``.
    No id is in both."""

    shared: tuple[int, ...]
    own: tuple[int, ...]

    def ids(self) -> Iterator[int]:
        return chain(self.shared, self.own)

    def __contains__(self, tq_id: object) -> bool:
        return tq_id in self.own or tq_id in self.shared


@dataclass(frozen=True)
class _Limits:
    """A task queue's site and CE restrictions."""

    sites: frozenset[str] = frozenset()
    banned: frozenset[str] = frozenset()
    ces: frozenset[str] = frozenset()

    def allow(self, r: Resource) -> bool:
        """The site and CE conditions of :func:`taskqueue.matching.claim.queue_conditions`."""
        return ce_allowed(self.ces, r) and site_allowed(self.sites, self.banned, r)


_FREE = _Limits()
#: (task queue id, its ClassAd expression or None, its restrictions)
_Candidate = tuple[int, str | None, _Limits]


def reach(session: Session, resources: Sequence[tuple[K, Resource, ExpressionCheck]], *,
          only: int | None = None) -> dict[K, Reach]:
    """For each ``(key, resource, check)``: the task queues (empty or not; task queue
    ``only``, when given) that ``resource`` could be served from, by the matcher's conditions
    and ``check`` for queues that carry a ClassAd expression."""
    groups: dict[tuple[Any, ...], list[tuple[K, Resource, ExpressionCheck]]] = defaultdict(list)
    for item in resources:
        groups[_terms(item[1])].append(item)
    if not groups:
        return {}
    limits = _limits(session, only)
    out: dict[K, Reach] = {}
    for members in groups.values():
        shared, by_site, anywhere = _matched(session, members[0][1], limits, only)
        everywhere = list(chain(anywhere, *by_site.values()))
        for key, r, check in members:
            candidates = everywhere if r.site is None else chain(
                anywhere, *(by_site.get(s, ()) for s in sorted(r.site)))
            own = dict.fromkeys(tq_id for tq_id, expression, lim in candidates
                                if lim.allow(r) and (expression is None or check(expression)))
            out[key] = Reach(shared, tuple(own))
    return {item[0]: out[item[0]] for item in resources}  # in the order asked


def _terms(r: Resource) -> tuple[Any, ...]:
    """What of a resource the SQL conditions read, but its site and CE."""
    return (r.vo, r.platform, r.job_type, r.owner_group, r.owner, r.submit_pools, r.tags,
            r.required_tags, r.cpu_time, r.processors, r.memory, r.gpus)


def _matched(session: Session, resource: Resource, limits: Mapping[int, _Limits],
             only: int | None) -> tuple[tuple[int, ...], dict[str, list[_Candidate]],
                                        list[_Candidate]]:
    """The task queues a resource's group matches but for site and CE: those every member
    reaches, those naming sites (by site), and the rest to check for each member."""
    terms = replace(resource, site=None, ce=None)
    tq = task_queues_table.c
    stmt = select(tq.id, tq.expression).where(*queue_conditions(terms, with_expressions=True))
    if only is not None:
        stmt = stmt.where(tq.id == only)
    shared: list[int] = []
    by_site: dict[str, list[_Candidate]] = defaultdict(list)
    anywhere: list[_Candidate] = []
    for row in session.connection().execute(stmt.order_by(tq.id),
                                            condition_parameters(terms)):
        tq_id, expression = int(row.id), row.expression
        lim = limits.get(tq_id, _FREE)
        if lim is _FREE and expression is None:
            shared.append(tq_id)
        elif lim.sites:
            for site in lim.sites:
                by_site[site].append((tq_id, expression, lim))
        else:
            anywhere.append((tq_id, expression, lim))
    return tuple(shared), by_site, anywhere


def _limits(session: Session, only: int | None) -> dict[int, _Limits]:
    """The restrictions of every task queue (``only`` that one) that has any."""
    values: dict[str, dict[int, set[str]]] = {}
    for name, table in (("sites", tq_sites_table), ("banned", tq_banned_sites_table),
                        ("ces", tq_ces_table)):
        stmt = select(table.c.tq_id, table.c.value)
        if only is not None:
            stmt = stmt.where(table.c.tq_id == only)
        per_queue: dict[int, set[str]] = defaultdict(set)
        for tq_id, value in session.execute(stmt):
            per_queue[int(tq_id)].add(value)
        values[name] = per_queue
    ids = set(chain(*(v.keys() for v in values.values())))
    return {tq_id: _Limits(**{name: frozenset(v.get(tq_id, ())) for name, v in values.items()})
            for tq_id in ids}
