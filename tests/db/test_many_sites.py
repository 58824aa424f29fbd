"""A resource naming more sites than taskqueue.matching.claim.MANY_SITES is matched through one set
term (the per-site terms passed SQLite's expression depth near 1,000 sites). It must find
exactly the task queues that some one of its sites finds alone."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime

from sqlalchemy import select

from taskqueue.core.resources import Resource, parse_resource
from taskqueue.core.settings import Settings
from taskqueue.db.models import task_queues_table
from taskqueue.matching.claim import condition_parameters, queue_conditions
from taskqueue.matching.rules import MANY_SITES
from tests.conftest import Database
from tests.helpers import requirements, submit

SITES = [f"LCG.Site{n:02d}.org" for n in range(50)]


def _found(db: Database, r: Resource) -> set[int]:
    tq = task_queues_table.c
    with db.factory.begin() as s:
        rows = s.connection().execute(select(tq.id).where(*queue_conditions(r)),
                                      condition_parameters(r))
        return {int(row.id) for row in rows}


def test_many_sites_find_what_their_sites_find_one_by_one(db: Database, settings: Settings,
                                                          now: datetime) -> None:
    rng = random.Random(11)
    jobs = [requirements(owner=f"u{n}", sites=rng.sample(SITES, rng.randint(0, 3)),
                         banned_sites=rng.sample(SITES, rng.randint(0, 2)))
            for n in range(40)]
    # Queues that name no site and ban exactly what a resource offers, or all but one of it.
    jobs += [requirements(owner="all-banned", banned_sites=SITES[:MANY_SITES + 2]),
             requirements(owner="one-left", banned_sites=SITES[1:MANY_SITES + 2])]
    with db.factory.begin() as s:
        submit(s, settings, now, jobs)
    offers = [SITES[:MANY_SITES + 2], SITES[1:MANY_SITES + 2]]
    offers += [rng.sample(SITES, rng.randint(MANY_SITES + 1, len(SITES))) for _ in range(4)]
    for offered in offers:
        r = parse_resource({"vo": "lhcb", "site": offered})
        assert r.site is not None and len(r.site) > MANY_SITES
        one_by_one: set[int] = set()
        for site in offered:
            one_by_one |= _found(db, replace(r, site=frozenset({site})))
        assert _found(db, r) == one_by_one, offered
    # The two edge queues: banned everywhere offered, or left one site.
    assert _found(db, parse_resource({"vo": "lhcb", "site": offers[1]})) != _found(
        db, parse_resource({"vo": "lhcb", "site": offers[0]}))
