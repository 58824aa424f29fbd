"""Why a task queue does or does not match a resource: every matching rule, one by one.

This is the matching of taskqueue.matching.claim restated in Python, rule by rule, for people;
a test checks that both agree on every case of the rule table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from taskqueue.core.buckets import memory_text
from taskqueue.core.definitions import TaskQueueDefinition
from taskqueue.core.resources import Resource


@dataclass(frozen=True)
class RuleResult:
    rule: str
    holds: bool
    detail: str


def _names(values: frozenset[str] | None) -> str:
    if values is None:
        return "ANY"
    return ", ".join(sorted(values)) if values else "none"


def site_allowed(sites: frozenset[str], banned: frozenset[str], r: Resource) -> bool:
    """The site rule: no site condition, or for one of the resource's sites the queue names
    no site or that one, and does not ban it."""
    return r.site is None or any((not sites or s in sites) and s not in banned
                                 for s in r.site)


def ce_allowed(ces: frozenset[str], r: Resource) -> bool:
    """The CE rule: no CE condition, or the queue names no CE or the resource's."""
    return r.ce is None or not ces or r.ce in ces


def explain_match(d: TaskQueueDefinition, r: Resource,
                  expression_check: Callable[[str], bool] | None = None, *,
                  of_queue: bool = False) -> list[RuleResult]:
    """Each matching rule for queue definition ``d`` and resource ``r``; ``of_queue``: ``r`` is
    what the pilots of a configured queue present (the details say so)."""
    out: list[RuleResult] = []

    def rule(name: str, holds: bool, detail: str) -> None:
        out.append(RuleResult(name, holds, detail))

    rule("VO", d.vo == r.vo, f"job's VO {d.vo}, resource's {r.vo}")
    if r.owner_group is not None:
        rule("owner group", d.owner_group in r.owner_group,
             f"job's group {d.owner_group}; resource takes {_names(r.owner_group)}")
    if r.owner is not None:
        rule("owner", d.owner == r.owner,
             f"job's owner {d.owner or '(group shares jobs)'}; resource takes {r.owner}")
    offer = "the pilots of this queue offer" if of_queue else "the resource offers"
    if r.cpu_time is None:
        rule("CPU time", True,
             f"job needs up to {d.cpu_time:,} s per core (bucket); {offer} no CPU bound")
    else:
        rule("CPU time", d.cpu_time <= r.cpu_time,
             f"job needs up to {d.cpu_time:,} s per core (bucket); {offer} {r.cpu_time:,} s "
             "per core")
    if r.processors is not None:
        rule("processors", d.processors <= r.processors,
             f"job needs {d.processors} (bucket); resource offers {r.processors}")
    if r.memory is not None:
        rule("memory", d.memory <= r.memory,
             f"job needs {memory_text(d.memory)} (bucket); resource offers {r.memory:,} MB")
    if r.job_type is not None:
        rule("job type", d.job_type in r.job_type,
             f"job type {d.job_type}; resource takes {_names(r.job_type)}")
    if d.submit_pool is None:
        rule("SubmitPool", True, "job has no RFC 7 requirements")
    else:
        rule("SubmitPool", r.submit_pools is not None and d.submit_pool in r.submit_pools,
             f"job's SubmitPool {d.submit_pool[:12]}…; resource presents "
             f"{_names(frozenset(p[:12] + '…' for p in r.submit_pools or ()))}")
    if r.site is not None:
        rule("site", site_allowed(d.sites, d.banned_sites, r),
             f"resource's site {_names(r.site)}; job allows {_names(d.sites) if d.sites else 'any'}"
             f", bans {_names(d.banned_sites)}")
    if r.ce is not None and d.ces:
        rule("CE", ce_allowed(d.ces, r),
             f"job runs on CEs {_names(d.ces)}; resource's CE is {r.ce}")
    if r.platform is not None:
        rule("platform", not d.platforms or bool(d.platforms & r.platform),
             f"job runs on {_names(d.platforms) if d.platforms else 'any'}; resource is "
             f"{_names(r.platform)}")
    if r.tags is not None:
        missing = d.tags - r.tags
        rule("tags", not missing,
             f"job needs tags {_names(d.tags)}; resource has {_names(r.tags)}"
             + (f" (missing {_names(frozenset(missing))})" if missing else ""))
    if r.required_tags:
        absent = r.required_tags - d.tags
        rule("required tags", not absent,
             f"resource runs only jobs tagged {_names(r.required_tags)}; job has "
             f"{_names(d.tags)}")
    if d.expression is not None:
        if expression_check is None:
            rule("Requirements expression", False,
                 f"{d.expression} (no evaluator given: cannot tell)")
        else:
            rule("Requirements expression", expression_check(d.expression),
                 f"{d.expression} against the resource")
    return out


def matches(d: TaskQueueDefinition, r: Resource,
            expression_check: Callable[[str], bool] | None = None) -> bool:
    return all(x.holds for x in explain_match(d, r, expression_check))
