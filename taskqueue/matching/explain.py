"""Why a task queue does or does not match a resource: every matching rule, one by one.

The rules are those of taskqueue.matching.rules (the table the SQL of
taskqueue.matching.claim is built from), each judged in Python and explained for people; a test
checks that both agree on every case of the rule table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from taskqueue.core.definitions import TaskQueueDefinition
from taskqueue.core.resources import Resource
from taskqueue.matching.rules import RULES, ce_allowed, site_allowed, verdict

__all__ = ["RuleResult", "ce_allowed", "explain_match", "matches", "site_allowed"]


@dataclass(frozen=True)
class RuleResult:
    rule: str
    holds: bool
    detail: str


def explain_match(d: TaskQueueDefinition, r: Resource,
                  expression_check: Callable[[str], bool] | None = None, *,
                  of_queue: bool = False) -> list[RuleResult]:
    """Each matching rule for queue definition ``d`` and resource ``r``; ``of_queue``: ``r`` is
    what the pilots of a configured queue present (the details say so)."""
    offer = "the pilots of this queue offer" if of_queue else "the resource offers"
    out: list[RuleResult] = []
    for rule in RULES:
        if not (rule.applies(r) or rule.shown_unset):
            continue
        detail = rule.explanation(d, r, offer)
        if detail is not None:
            out.append(RuleResult(rule.name, verdict(rule, d, r), detail))
    if d.expression is not None:
        if expression_check is None:
            out.append(RuleResult("Requirements expression", False,
                                  f"{d.expression} (no evaluator given: cannot tell)"))
        else:
            out.append(RuleResult("Requirements expression", expression_check(d.expression),
                                  f"{d.expression} against the resource"))
    return out


def matches(d: TaskQueueDefinition, r: Resource,
            expression_check: Callable[[str], bool] | None = None) -> bool:
    return all(x.holds for x in explain_match(d, r, expression_check))
