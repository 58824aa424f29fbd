"""Every matching rule of docs/ARCHITECTURE.md, one by one, matching and not matching."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from taskqueue.core.definitions import TaskQueueDefinition
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.matching.claim import matching_queues
from taskqueue.matching.explain import explain_match
from tests.conftest import Database
from tests.helpers import claim, requirements, submit

# (job requirements, resource description, whether the resource gets the job)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], bool]] = {
    "vo equal": ({}, {}, True),
    "vo differs": ({}, {"vo": "belle"}, False),
    "owner group allowed": ({}, {"owner_group": ["lhcb_user", "x"]}, True),
    "owner group refused": ({}, {"owner_group": "lhcb_prod"}, False),
    "owner allowed": ({}, {"owner": "alice"}, True),
    "owner refused": ({}, {"owner": "bob"}, False),
    "cpu bucket fits": ({"cpu_time": 3000}, {"cpu_time": 3600}, True),
    "cpu bucket too long": ({"cpu_time": 3000}, {"cpu_time": 3599}, False),
    "cpu unknown on resource": ({"cpu_time": 10**6}, {}, True),
    "cpu per core of a multi-core job fits": ({"cpu_time": 8 * 3000, "processors": 8},
                                              {"cpu_time": 3600, "processors": 8}, True),
    "cpu per core of a multi-core job too long": ({"cpu_time": 8 * 3000, "processors": 8},
                                                  {"cpu_time": 3599, "processors": 8}, False),
    "cpu per core rounded up": ({"cpu_time": 3 * 3600 + 1, "processors": 3},
                                {"cpu_time": 3600, "processors": 4}, False),
    "site listed": ({"sites": ["A", "B"]}, {"site": "B"}, True),
    "site not listed": ({"sites": ["A"]}, {"site": "B"}, False),
    "job names no site": ({}, {"site": "B"}, True),
    "site banned": ({"banned_sites": ["B"]}, {"site": "B"}, False),
    "other site banned": ({"banned_sites": ["A"]}, {"site": "B"}, True),
    "site listed and banned": ({"sites": ["B"], "banned_sites": ["B"]}, {"site": "B"}, False),
    "resource names no site": ({"sites": ["A"]}, {}, True),
    "site ANY": ({"sites": ["A"], "banned_sites": ["A"]}, {"site": "ANY"}, True),
    "one of several sites allowed": ({"sites": ["A"], "banned_sites": ["B"]},
                                     {"site": ["B", "A"]}, True),
    "several sites all refused": ({"sites": ["A", "B"], "banned_sites": ["B"]},
                                  {"site": ["B", "C"]}, False),
    "platform listed": ({"platforms": ["el9", "el8"]}, {"platform": "el9"}, True),
    "platform not listed": ({"platforms": ["el8"]}, {"platform": "el9"}, False),
    "job names no platform": ({}, {"platform": "el9"}, True),
    "platform ANY": ({"platforms": ["el8"]}, {"platform": "any"}, True),
    "job type listed": ({"job_type": "MCSimulation"}, {"job_type": ["User", "MCSimulation"]},
                        True),
    "job type not listed": ({"job_type": "MCSimulation"}, {"job_type": "User"}, False),
    "job type unset on resource": ({"job_type": "MCSimulation"}, {}, True),
    "untagged queue, untagged resource": ({}, {}, True),
    "tagged queue, untagged resource": ({"tags": ["GPU"]}, {}, False),
    "tags subset": ({"tags": ["GPU"]}, {"tags": ["GPU", "MultiProcessor"]}, True),
    "tags not subset": ({"tags": ["GPU", "AVX512"]}, {"tags": ["GPU"]}, False),
    "tags ANY": ({"tags": ["GPU", "AVX512"]}, {"tags": "ANY"}, True),
    "required tag present": ({"tags": ["GPU"]}, {"tags": ["GPU"], "required_tags": "GPU"}, True),
    "required tag absent": ({}, {"tags": ["GPU"], "required_tags": ["GPU"]}, False),
    "processors bucket fits": ({"processors": 8}, {"processors": 8}, True),
    "processors bucket too big": ({"processors": 9}, {"processors": 9}, False),
    "processors bucket fits rounded": ({"processors": 9}, {"processors": 10}, True),
    "memory bucket fits": ({"memory": 3000}, {"memory": 3072}, True),
    "memory bucket too big": ({"memory": 3000}, {"memory": 3071}, False),
    "submit pool presented": ({"submit_pool": "p1"}, {"submit_pools": ["p0", "p1"]}, True),
    "submit pool not presented": ({"submit_pool": "p1"}, {"submit_pools": "p0"}, False),
    "no submit pool, pilot presents some": ({}, {"submit_pools": "p0"}, True),
    "submit pool, pilot presents none": ({"submit_pool": "p1"}, {}, False),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.usefixtures("claim_entry")
def test_rule(db: Database, settings: Settings, now: datetime, case: str) -> None:
    job, resource, expected = CASES[case]
    pool_ids = {"p0": "0" * 64, "p1": "1" * 64}
    with db.factory.begin() as s:
        if "submit_pool" in job:
            from taskqueue.queues.submitpools import store_submit_pool
            for name in pool_ids:
                assert store_submit_pool(s, {"Tag": name}, now=now)
            job = {**job, "submit_pool": _pool_id(job["submit_pool"])}
        if "submit_pools" in resource:
            names = resource["submit_pools"]
            names = [names] if isinstance(names, str) else names
            resource = {**resource, "submit_pools": [_pool_id(n) for n in names]}
        (job_id,) = submit(s, settings, now, [requirements(**job)])
    with db.factory.begin() as s:
        counts = matching_queues(s, parse_resource({"vo": "lhcb", **resource}))
    with db.factory.begin() as s:
        claims = claim(s, now, **resource)
    assert [c.job_id for c in claims] == ([job_id] if expected else [])
    assert sum(c.waiting for c in counts) == (1 if expected else 0)


def _pool_id(name: str) -> str:
    from taskqueue.queues.submitpools import submit_pool_id
    return submit_pool_id({"Tag": name})


@pytest.mark.parametrize("case", list(CASES))
def test_explanation_agrees_with_the_query(case: str) -> None:
    """taskqueue.matching.explain restates the SQL rules in Python; both must say the same."""
    job, resource, expected = CASES[case]
    job = {**job, "submit_pool": _pool_id(job["submit_pool"])} if "submit_pool" in job else job
    if "submit_pools" in resource:
        names = resource["submit_pools"]
        names = [names] if isinstance(names, str) else names
        resource = {**resource, "submit_pools": [_pool_id(n) for n in names]}
    definition = TaskQueueDefinition.for_job(requirements(**job), Settings())
    results = explain_match(definition, parse_resource({"vo": "lhcb", **resource}))
    assert all(r.holds for r in results) is expected, results
