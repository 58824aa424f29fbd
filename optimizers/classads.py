"""ClassAd Requirements expressions (gLite style): canonical text and evaluation against a
resource.

A job's expression is evaluated with the job as MY and the resource as TARGET (so ``other.X``
names the resource's X). Undefined, error, and anything that raises count as "does not match":
only a result that *is* True matches (``bool(Value.Undefined)`` is True in classad2).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from optimizers.description import JobDescriptionError
from taskqueue.resources import Resource

os.environ.setdefault("CONDOR_CONFIG", "/dev/null")
import classad2

log = logging.getLogger(__name__)

_EMPTY_JOB = classad2.ClassAd()


def canonical_expression(text: str, label: str = "Requirements") -> str:
    """The expression re-printed by the ClassAd library: one spelling per expression."""
    try:
        return str(classad2.ExprTree(text))
    except classad2.ClassAdException as exc:
        raise JobDescriptionError(f"{label} is not a valid ClassAd expression: {text}",
                                  label) from exc


def resource_ad(resource: Resource) -> classad2.ClassAd:
    """The resource as a ClassAd, with the attribute names JDL expressions use."""
    attrs: dict[str, Any] = {"VO": resource.vo}
    if resource.site is not None:
        sites = sorted(resource.site)
        attrs["Site"] = sites[0] if len(sites) == 1 else sites
    for name, value in (("CE", resource.ce), ("Queue", resource.queue)):
        if value is not None:
            attrs[name] = value
    if resource.platform is not None:
        attrs["Platform"] = sorted(resource.platform)
    if resource.tags is not None:
        attrs["Tags"] = sorted(resource.tags)
    for name, number in (("CPUTime", resource.cpu_time), ("NumberOfProcessors",
                                                         resource.processors),
                         ("Memory", resource.memory), ("MaxRAM", resource.memory)):
        if number is not None:
            attrs[name] = number
    for key, value in resource.extra.items():
        if isinstance(value, str | int | float | bool) or (
                isinstance(value, list) and all(isinstance(v, str | int | float) for v in value)):
            attrs.setdefault(key, value)
    return classad2.ClassAd(attrs)


def expression_check(resource: Resource) -> Callable[[str], bool]:
    """A check for taskqueue.matching: does ``resource`` satisfy an expression's text?

    The resource's ad is built on the first expression to evaluate: most matches meet no
    queue with an expression, and each ad costs time and some never-freed native memory."""
    target: list[classad2.ClassAd] = []

    def check(text: str) -> bool:
        if not target:
            target.append(resource_ad(resource))
        return evaluates_true(text, target[0])

    return check


def evaluates_true(text: str, target: classad2.ClassAd) -> bool:
    try:
        result = classad2.ExprTree(text).eval(scope=_EMPTY_JOB, target=target)
    except classad2.ClassAdException:
        log.info("Requirements expression could not be evaluated: %s", text)
        return False
    return result is True
