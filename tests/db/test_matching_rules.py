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
from taskqueue.matching.rules import RULES, Compare, Rule
from tests.conftest import Database
from tests.helpers import claim, requirements, submit

#: (job requirements, resource description, whether the resource gets the job)
Case = tuple[dict[str, Any], dict[str, Any], bool]

#: A job's requirement that each bucketed rule is tried with (between two buckets).
_BUCKETED = {"cpu_time": 3000, "processors": 9, "memory": 3000, "gpus": 9}


def _rule_cases(rule: Rule) -> dict[str, Case]:
    """The cases a rule's entry states by itself: its field set to a value the queue's passes
    and to one it fails, and left unset. Named "<rule>: <case>"."""
    key, field = rule.definition, rule.field
    out: dict[str, Case] = {}
    match rule.compare:
        case Compare.EQUAL:
            value = getattr(requirements(), key)
            out = {"equal": ({}, {field: value}, True),
                   "differs": ({}, {field: value + "-other"}, False)}
        case Compare.ONE_OF:
            job = {"job_type": "MCSimulation"} if key == "job_type" else {}
            value = getattr(requirements(**job), key)
            out = {"listed": (job, {field: ["x", value]}, True),
                   "not listed": (job, {field: "other"}, False),
                   "unset on resource": (job, {}, True)}
        case Compare.AT_MOST:
            needs = {key: _BUCKETED[key]}
            bucket = getattr(TaskQueueDefinition.for_job(requirements(**needs), Settings()), key)
            assert bucket > _BUCKETED[key], (key, bucket)  # the resource's next value fails
            # A field left out sets no condition, or offers its default (GPUs: none).
            unset = getattr(parse_resource({"vo": "lhcb"}), field)
            out = {"bucket fits": (needs, {field: bucket}, True),
                   "bucket too big": (needs, {field: bucket - 1}, False),
                   "unset on resource": (needs, {}, unset is None or bucket <= unset)}
        case Compare.LISTS_NONE_OR_ONE_OF | Compare.LISTS_NONE_OR_EQUAL:
            out = {"listed": ({key: ["v1", "v2"]}, {field: "v2"}, True),
                   "not listed": ({key: ["v1"]}, {field: "v2"}, False),
                   "job lists none": ({}, {field: "v2"}, True),
                   "resource names none": ({key: ["v1"]}, {}, True)}
        case Compare.LISTS_ONLY:
            out = {"subset": ({key: ["a"]}, {field: ["a", "b"]}, True),
                   "not subset": ({key: ["a", "b"]}, {field: ["a"]}, False),
                   "job lists none, resource none": ({}, {}, True),
                   "job lists one, resource none": ({key: ["a"]}, {}, False)}
        case Compare.LISTS_EACH:
            out = {"present": ({key: ["a"]}, {"tags": ["a"], field: "a"}, True),
                   "absent": ({}, {"tags": ["a"], field: ["a"]}, False)}
        case Compare.SITE | Compare.UNSET_OR_ONE_OF:
            pass  # their cases need names the table cannot give: STATED below
    return {f"{rule.name}: {name}": case for name, case in out.items()}


#: The cases the rule table cannot state: sites and banned sites, SubmitPools (stored
#: first), ANY, CPU time per core.
STATED: dict[str, Case] = {
    "CPU time: per core of a multi-core job fits": (
        {"cpu_time": 8 * 3000, "processors": 8}, {"cpu_time": 3600, "processors": 8}, True),
    "CPU time: per core of a multi-core job too long": (
        {"cpu_time": 8 * 3000, "processors": 8}, {"cpu_time": 3599, "processors": 8}, False),
    "CPU time: per core rounded up": ({"cpu_time": 3 * 3600 + 1, "processors": 3},
                                      {"cpu_time": 3600, "processors": 4}, False),
    "site: listed": ({"sites": ["A", "B"]}, {"site": "B"}, True),
    "site: not listed": ({"sites": ["A"]}, {"site": "B"}, False),
    "site: job names none": ({}, {"site": "B"}, True),
    "site: banned": ({"banned_sites": ["B"]}, {"site": "B"}, False),
    "site: other site banned": ({"banned_sites": ["A"]}, {"site": "B"}, True),
    "site: listed and banned": ({"sites": ["B"], "banned_sites": ["B"]}, {"site": "B"}, False),
    "site: resource names none": ({"sites": ["A"]}, {}, True),
    "site: ANY": ({"sites": ["A"], "banned_sites": ["A"]}, {"site": "ANY"}, True),
    "site: one of several allowed": ({"sites": ["A"], "banned_sites": ["B"]},
                                     {"site": ["B", "A"]}, True),
    "site: several all refused": ({"sites": ["A", "B"], "banned_sites": ["B"]},
                                  {"site": ["B", "C"]}, False),
    "platform: ANY": ({"platforms": ["el8"]}, {"platform": "any"}, True),
    "tags: ANY": ({"tags": ["GPU", "AVX512"]}, {"tags": "ANY"}, True),
    "GPUs: a job without GPUs, a resource without": ({}, {}, True),
    "GPUs: a job without GPUs, a resource with": ({}, {"gpus": 2}, True),
    "GPUs: one needed, one offered": ({"gpus": 1}, {"gpus": 1}, True),
    "GPUs: one needed, none offered": ({"gpus": 1}, {"gpus": 0}, False),
    "SubmitPool: presented": ({"submit_pool": "p1"}, {"submit_pools": ["p0", "p1"]}, True),
    "SubmitPool: not presented": ({"submit_pool": "p1"}, {"submit_pools": "p0"}, False),
    "SubmitPool: job has none, pilot presents some": ({}, {"submit_pools": "p0"}, True),
    "SubmitPool: job has one, pilot presents none": ({"submit_pool": "p1"}, {}, False),
}

CASES: dict[str, Case] = {name: case for rule in RULES
                          for name, case in _rule_cases(rule).items()} | STATED


def test_every_rule_has_a_case_that_holds_and_one_that_fails() -> None:
    for rule in RULES:
        outcomes = {expected for name, (_, _, expected) in CASES.items()
                    if name.startswith(f"{rule.name}: ")}
        assert outcomes == {True, False}, f"rule {rule.name!r} has cases {outcomes}"


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
    failing = [r.rule for r in results if not r.holds]
    assert failing == ([] if expected else [case.split(": ")[0]]), results
