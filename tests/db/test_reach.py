"""taskqueue.matching.reach matches many resources in one pass; it must find, for each, exactly the
task queues the matcher's conditions find for that resource alone."""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

from sqlalchemy import select

from optimizers.classads import expression_check
from taskqueue.core.resources import Resource, parse_resource
from taskqueue.core.settings import Settings
from taskqueue.db.models import task_queues_table
from taskqueue.matching.claim import ExpressionCheck, condition_parameters, queue_conditions
from taskqueue.matching.reach import reach
from tests.conftest import Database
from tests.helpers import requirements, submit

SITES = ["A", "B", "C", "D"]
CES = ["ce1", "ce2", "ce3"]


def _some(rng: random.Random, pool: list[str], most: int) -> list[str]:
    return rng.sample(pool, rng.randint(0, most))


def _job(rng: random.Random, n: int) -> dict[str, Any]:
    return {"owner": f"u{n % 3}", "sites": _some(rng, SITES, 2),
            "banned_sites": _some(rng, SITES, 1) if rng.random() < 0.3 else [],
            "ces": _some(rng, CES, 2) if rng.random() < 0.3 else [],
            "platforms": _some(rng, ["el8", "el9"], 1), "tags": _some(rng, ["GPU"], 1),
            "cpu_time": rng.choice([0, 3600, 7200]), "processors": rng.choice([1, 1, 4]),
            "expression": rng.choice([None, None, None, 'other.Site == "B"',
                                      "other.Memory > 4000"])}


def _resource(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {"vo": "lhcb", "platform": rng.choice(["el8", "el9"]),
                           "tags": rng.choice([[], ["GPU"]]),
                           "cpu_time": rng.choice([3600, 7200]),
                           "processors": rng.choice([1, 4]), "Memory": rng.choice([2000, 8000])}
    shape = rng.random()
    if shape < 0.7:  # a configured queue: one site, one CE
        out |= {"site": rng.choice(SITES), "ce": rng.choice(CES)}
    elif shape < 0.8:
        out |= {"site": rng.sample(SITES, 2)}
    elif shape < 0.9:
        out |= {"ce": rng.choice(CES)}
    return out


def _alone(db: Database, r: Resource, check: ExpressionCheck) -> set[int]:
    """What the matcher's conditions find for ``r`` in a query of its own."""
    tq = task_queues_table.c
    with db.factory.begin() as s:
        rows = s.connection().execute(
            select(tq.id, tq.expression).where(*queue_conditions(r, with_expressions=True)),
            condition_parameters(r))
        return {int(row.id) for row in rows if row.expression is None or check(row.expression)}


def test_one_pass_finds_what_each_resource_finds_alone(db: Database, settings: Settings,
                                                       now: datetime) -> None:
    rng = random.Random(7)
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(**_job(rng, n)) for n in range(80)])
    resources = []
    for n in range(60):
        r = parse_resource(_resource(rng))
        resources.append((n, r, expression_check(r)))
    with db.factory.begin() as s:
        found = reach(s, resources)
    assert list(found) == [n for n, _, _ in resources]
    matched = 0
    for n, r, check in resources:
        assert not set(found[n].shared) & set(found[n].own)
        assert sorted(found[n].ids()) == sorted(_alone(db, r, check)), r
        matched += bool(found[n].own) and bool(found[n].shared)
    assert matched  # both kinds of task queue were met


def test_only_one_task_queue(db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(owner="a", sites=["A"]),
                                  requirements(owner="b")])
        ids = sorted(s.scalars(select(task_queues_table.c.id)))
    at_a = parse_resource({"vo": "lhcb", "site": "A", "ce": "ce1"})
    at_b = parse_resource({"vo": "lhcb", "site": "B", "ce": "ce1"})
    asked = [("a", at_a, expression_check(at_a)), ("b", at_b, expression_check(at_b))]
    with db.factory.begin() as s:
        first = reach(s, asked, only=ids[0])
        second = reach(s, asked, only=ids[1])
        assert reach(s, []) == {}
    assert (ids[0] in first["a"], ids[0] in first["b"]) == (True, False)
    assert (list(first["a"].ids()), list(second["a"].ids())) == ([ids[0]], [ids[1]])
    assert list(second["b"].ids()) == [ids[1]]
