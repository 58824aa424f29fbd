"""The matching rules, one entry each: which field of the resource description is compared with
which column (or value table) of a task queue, how, and what a person reads of it.

taskqueue.matching.claim builds its SQL conditions from this table (:data:`RULES`, in this
order) and taskqueue.matching.explain its per-rule verdicts (:func:`verdict`), so that a rule
is stated once. The database functions of taskqueue/matching/sql/ restate the same rules in
their own SQL; tests/db/test_matching_rules.py runs every implementation against cases drawn
from this table. A ClassAd Requirements expression is no entry: the optimizers evaluate it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from taskqueue.core.buckets import memory_text
from taskqueue.core.definitions import TaskQueueDefinition
from taskqueue.core.resources import Resource

#: Above this many sites a resource's site condition is one set term rather than one term per
#: site (see taskqueue.matching.claim).
MANY_SITES = 32


class Compare(Enum):
    """How a queue's value is compared with the resource's (``value``: the resource's field)."""

    #: The queue's column equals the value.
    EQUAL = "equals"
    #: The queue's column is one of the values.
    ONE_OF = "is one of"
    #: The queue's column (a bucket) is at most the value.
    AT_MOST = "is at most"
    #: The queue's column is unset, or one of the values; checked when the resource gives no
    #: values too (then only queues with the column unset match).
    UNSET_OR_ONE_OF = "is unset or one of"
    #: The queue's value table lists nothing, or one of the values.
    LISTS_NONE_OR_ONE_OF = "lists nothing or one of"
    #: The queue's value table lists nothing, or the value.
    LISTS_NONE_OR_EQUAL = "lists nothing or"
    #: Every value the queue's table lists is among the values (an empty set: the queue lists
    #: nothing).
    LISTS_ONLY = "lists only values among"
    #: The queue's value table lists each of the values.
    LISTS_EACH = "lists each of"
    #: The queue allows one of the resource's sites (names none or that one) and does not ban
    #: it (tq_sites and tq_banned_sites).
    SITE = "allows one of the sites"


#: Explanation of a rule for a person: (queue definition, resource, "the resource offers" or
#: "the pilots of this queue offer") -> the detail, or None when the rule is not shown.
Explanation = Callable[[TaskQueueDefinition, Resource, str], "str | None"]


@dataclass(frozen=True)
class Rule:
    #: The rule's name as explain shows it.
    name: str
    #: The field of taskqueue.core.resources.Resource.
    field: str
    #: The column of task_queues, or the value table (``tq_...``) the field is compared with.
    queue: str
    #: The attribute of taskqueue.core.definitions.TaskQueueDefinition that holds it.
    definition: str
    compare: Compare
    #: The name of the SQL bind parameter of the resource's value (``_0``, ``_1``... appended
    #: for one parameter per value).
    param: str
    explanation: Explanation
    #: Shown by explain (as holding) when the resource leaves the field unset.
    shown_unset: bool = False

    def value(self, r: Resource) -> Any:
        return getattr(r, self.field)

    def applies(self, r: Resource) -> bool:
        """Whether the rule constrains resource ``r`` at all."""
        if self.compare is Compare.UNSET_OR_ONE_OF:
            return True
        value = self.value(r)
        if self.compare is Compare.LISTS_EACH:
            return bool(value)
        return value is not None

    def shape(self, r: Resource) -> bool | int | str:
        """What the SQL of the rule depends on for ``r`` (the statements are built once per
        shape): whether the field is set, or how many values it names, or how tags apply."""
        value = self.value(r)
        if self.compare is Compare.LISTS_ONLY:
            return "any" if value is None else ("some" if value else "none")
        if self.compare is Compare.LISTS_EACH:
            return len(value)
        if self.compare is Compare.SITE:
            return -1 if value is None else min(len(value), MANY_SITES + 1)
        return value is not None

    def parameters(self, r: Resource) -> dict[str, Any]:
        """The bind parameters of the rule's SQL for ``r``."""
        value = self.value(r)
        if value is None:
            return {}
        if self.compare in (Compare.EQUAL, Compare.AT_MOST, Compare.LISTS_NONE_OR_EQUAL):
            return {self.param: value}
        if self.compare is Compare.LISTS_EACH:
            return {f"{self.param}_{i}": v for i, v in enumerate(sorted(value))}
        if self.compare is Compare.SITE:
            if len(value) > MANY_SITES:
                return {self.param: sorted(value), f"{self.param}_count": len(value)}
            return {f"{self.param}_{i}": v for i, v in enumerate(sorted(value))}
        return {self.param: sorted(value)} if value else {}


def verdict(rule: Rule, d: TaskQueueDefinition, r: Resource) -> bool:
    """Whether queue definition ``d`` passes ``rule`` for resource ``r`` (the SQL's answer)."""
    if not rule.applies(r):
        return True
    queue = getattr(d, rule.definition)
    value = rule.value(r)
    match rule.compare:
        case Compare.EQUAL:
            return bool(queue == value)
        case Compare.ONE_OF:
            return queue in value
        case Compare.AT_MOST:
            return bool(queue <= value)
        case Compare.UNSET_OR_ONE_OF:
            return queue is None or (value is not None and queue in value)
        case Compare.LISTS_NONE_OR_ONE_OF:
            return not queue or bool(queue & value)
        case Compare.LISTS_NONE_OR_EQUAL:
            return not queue or value in queue
        case Compare.LISTS_ONLY:
            return bool(queue <= value)
        case Compare.LISTS_EACH:
            return bool(value <= queue)
        case Compare.SITE:
            return site_allowed(d.sites, d.banned_sites, r)
    raise AssertionError(rule.compare)


def site_allowed(sites: frozenset[str], banned: frozenset[str], r: Resource) -> bool:
    """The site rule: no site condition, or for one of the resource's sites the queue names
    no site or that one, and does not ban it."""
    return r.site is None or any((not sites or s in sites) and s not in banned
                                 for s in r.site)


def ce_allowed(ces: frozenset[str], r: Resource) -> bool:
    """The CE rule: no CE condition, or the queue names no CE or the resource's."""
    return r.ce is None or not ces or r.ce in ces


def names(values: frozenset[str] | None) -> str:
    if values is None:
        return "ANY"
    return ", ".join(sorted(values)) if values else "none"


def _cpu_time(d: TaskQueueDefinition, r: Resource, offer: str) -> str:
    if r.cpu_time is None:
        return f"job needs up to {d.cpu_time:,} s per core (bucket); {offer} no CPU bound"
    return (f"job needs up to {d.cpu_time:,} s per core (bucket); {offer} {r.cpu_time:,} s "
            "per core")


def _submit_pool(d: TaskQueueDefinition, r: Resource, _offer: str) -> str:
    if d.submit_pool is None:
        return "job has no RFC 7 requirements"
    return (f"job's SubmitPool {d.submit_pool[:12]}…; resource presents "
            f"{names(frozenset(p[:12] + '…' for p in r.submit_pools or ()))}")


def _tags(d: TaskQueueDefinition, r: Resource, _offer: str) -> str:
    missing = d.tags - (r.tags or frozenset())
    return (f"job needs tags {names(d.tags)}; resource has {names(r.tags)}"
            + (f" (missing {names(frozenset(missing))})" if missing else ""))


#: The rules, in the order explain shows them and the SQL checks them.
RULES: tuple[Rule, ...] = (
    Rule("VO", "vo", "vo", "vo", Compare.EQUAL, "r_vo",
         lambda d, r, _: f"job's VO {d.vo}, resource's {r.vo}"),
    Rule("owner group", "owner_group", "owner_group", "owner_group", Compare.ONE_OF, "r_groups",
         lambda d, r, _: f"job's group {d.owner_group}; resource takes {names(r.owner_group)}"),
    Rule("owner", "owner", "owner", "owner", Compare.EQUAL, "r_owner",
         lambda d, r, _: (f"job's owner {d.owner or '(group shares jobs)'}; resource takes "
                          f"{r.owner}")),
    Rule("CPU time", "cpu_time", "cpu_time", "cpu_time", Compare.AT_MOST, "r_cpu", _cpu_time,
         shown_unset=True),
    Rule("processors", "processors", "processors", "processors", Compare.AT_MOST, "r_procs",
         lambda d, r, _: f"job needs {d.processors} (bucket); resource offers {r.processors}"),
    Rule("memory", "memory", "memory", "memory", Compare.AT_MOST, "r_mem",
         lambda d, r, _: (f"job needs {memory_text(d.memory)} (bucket); resource offers "
                          f"{r.memory:,} MB")),
    Rule("GPUs", "gpus", "gpus", "gpus", Compare.AT_MOST, "r_gpus",
         lambda d, r, _: (f"job needs {d.gpus} GPUs (bucket); resource offers {r.gpus}"
                          if d.gpus or r.gpus else None)),
    Rule("job type", "job_type", "job_type", "job_type", Compare.ONE_OF, "r_types",
         lambda d, r, _: f"job type {d.job_type}; resource takes {names(r.job_type)}"),
    Rule("SubmitPool", "submit_pools", "submit_pool", "submit_pool", Compare.UNSET_OR_ONE_OF,
         "r_pools", _submit_pool),
    Rule("site", "site", "tq_sites", "sites", Compare.SITE, "r_site",
         lambda d, r, _: (f"resource's site {names(r.site)}; job allows "
                          f"{names(d.sites) if d.sites else 'any'}, bans "
                          f"{names(d.banned_sites)}")),
    Rule("CE", "ce", "tq_ces", "ces", Compare.LISTS_NONE_OR_EQUAL, "r_ce",
         lambda d, r, _: (f"job runs on CEs {names(d.ces)}; resource's CE is {r.ce}"
                          if d.ces else None)),
    Rule("platform", "platform", "tq_platforms", "platforms", Compare.LISTS_NONE_OR_ONE_OF,
         "r_platforms",
         lambda d, r, _: (f"job runs on {names(d.platforms) if d.platforms else 'any'}; "
                          f"resource is {names(r.platform)}")),
    Rule("tags", "tags", "tq_tags", "tags", Compare.LISTS_ONLY, "r_tags", _tags),
    Rule("required tags", "required_tags", "tq_tags", "tags", Compare.LISTS_EACH, "r_req",
         lambda d, r, _: (f"resource runs only jobs tagged {names(r.required_tags)}; job has "
                          f"{names(d.tags)}")),
)

RULES_BY_NAME: dict[str, Rule] = {rule.name: rule for rule in RULES}
