"""ClassAd Requirements expressions (gLite style): canonical text and evaluation against a
resource.

A job's expression is evaluated with the job as MY and the resource as TARGET (so ``other.X``
names the resource's X). Undefined, error, and anything that raises count as "does not match":
only a result that *is* True matches (``bool(Value.Undefined)`` is True in classad2).

Cost. Only expressions that optimizers.expressions accepts are evaluated (one stored before
those limits existed is "no match" without evaluation). Each process remembers, in a bounded
LRU, the verdict per expression and per values of the resource attributes that expression
reads, so a queue whose expression fails for a kind of resource costs one evaluation, not one
per pilot. An evaluation that takes more than :data:`EVALUATION_BUDGET` seconds of CPU time
(optimizers.cputime: a loaded machine's waits do not count) is logged and its expression is
not evaluated again by this process (it matches nothing).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from optimizers.cputime import Stopwatch
from optimizers.description import JobDescriptionError
from optimizers.expressions import (
    Analysis,
    ExpressionError,
    analyse,
    attributes_read,
    conjuncts,
)
from taskqueue.core.resources import Resource

os.environ.setdefault("CONDOR_CONFIG", "/dev/null")
import classad2

log = logging.getLogger(__name__)

_EMPTY_JOB = classad2.ClassAd()
#: Most CPU time one evaluation may take before its expression is no longer evaluated, in
#: seconds.
EVALUATION_BUDGET = 0.05
#: Verdicts remembered per process (expression, values of the attributes it reads).
VERDICTS_KEPT = 4096
_LARGEST_INT = 2**63 - 1


def canonical_expression(text: str, label: str = "Requirements") -> str:
    """The expression re-printed by the ClassAd library: one spelling per expression.

    An expression whose evaluation cost is not bounded (see optimizers.expressions) is
    refused, before and after the library reads it."""
    check_cost(text, label)
    try:
        canonical = str(classad2.ExprTree(text))
    except classad2.ClassAdException as exc:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise JobDescriptionError(f"{label} is not a valid ClassAd expression: {shown}",
                                  label) from exc
    check_cost(canonical, label)
    return canonical


def check_cost(text: str, label: str = "Requirements") -> Analysis:
    """The expression's analysis, or a JobDescriptionError saying why it is refused."""
    try:
        return analyse(text)
    except ExpressionError as exc:
        raise JobDescriptionError(f"{label} {exc}", label) from exc


def resource_ad(resource: Resource) -> classad2.ClassAd:
    """The resource as a ClassAd, with the attribute names JDL expressions use."""
    return classad2.ClassAd(resource_attributes(resource))


def resource_attributes(resource: Resource) -> dict[str, Any]:
    """The resource's attributes as an expression sees them (one spelling per name)."""
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
                         ("Memory", resource.memory), ("MaxRAM", resource.memory),
                         ("NumberOfGPUs", resource.gpus)):
        if number is not None:
            attrs[name] = number
    known = {name.lower() for name in attrs}
    for key, value in resource.extra.items():
        if key.lower() in known or not _ad_value(value):
            continue  # a name given twice, or a value a ClassAd cannot hold: undefined
        known.add(key.lower())
        attrs[key] = value
    return attrs


def _ad_value(value: Any) -> bool:
    if isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return -_LARGEST_INT - 1 <= value <= _LARGEST_INT
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    return isinstance(value, list) and all(
        not isinstance(v, bool) and isinstance(v, str | int | float) and _ad_value(v)
        for v in value)


def expression_check(resource: Resource) -> Callable[[str], bool]:
    """A check for taskqueue.matching.claim: does ``resource`` satisfy an expression's text?

    The resource's ad is built on the first expression to evaluate: most matches meet no
    queue with an expression, and each ad costs time and some never-freed native memory."""
    target: list[classad2.ClassAd] = []
    values: list[dict[str, Any]] = []

    def check(text: str) -> bool:
        analysis = _accepted(text)
        if analysis is None or text in _too_slow:
            return False
        if not values:
            values.append({k.lower(): _frozen(v) for k, v in
                           resource_attributes(resource).items()})
        key = (text, tuple((name, values[0].get(name)) for name in sorted(analysis.attributes)))
        verdict = _verdicts.get(key)
        if verdict is None:
            if not target:
                target.append(classad2.ClassAd(resource_attributes(resource)))
            verdict = _timed(text, target[0])
            _verdicts.put(key, verdict)
        return verdict

    return check


def evaluates_true(text: str, target: classad2.ClassAd) -> bool:
    try:
        result = _parsed(text).eval(scope=_EMPTY_JOB, target=target)
    except (classad2.ClassAdException, ValueError, OverflowError):
        log.info("Requirements expression could not be evaluated: %s", text[:200])
        return False
    return result is True


def never_holds(text: str, resource: Resource) -> bool:
    """Whether the expression is definitely false for ``resource`` (not merely undefined,
    which a real pilot's extra attributes could change)."""
    if _accepted(text) is None:
        return True
    try:
        result = _parsed(text).eval(scope=_EMPTY_JOB,
                                    target=classad2.ClassAd(resource_attributes(resource)))
    except (classad2.ClassAdException, ValueError, OverflowError):
        return False
    return result is False


def why_not(text: str, resource: Resource) -> str:
    """The first part of an expression that does not hold for ``resource``, with the values
    the resource gives the attributes it names: ``other.MaxRAM >= 8000 is false (other.MaxRAM
    = 4000)``."""
    if _accepted(text) is None:
        return f"{text[:80]} is not evaluated: its cost is not bounded"
    target = classad2.ClassAd(resource_attributes(resource))
    for part in conjuncts(text):
        try:
            result = classad2.ExprTree(part).eval(scope=_EMPTY_JOB, target=target)
        except (classad2.ClassAdException, ValueError, OverflowError):
            result = "an error"
        if result is True:
            continue
        shown = ("false" if result is False else "undefined"
                 if result is classad2.Value.Undefined else "an error"
                 if result is classad2.Value.Error or result == "an error" else f"{result!r}")
        values = []
        for name in attributes_read(part):
            value = target.get(name.split(".", 1)[1])
            values.append(f"{name} = " + ("undefined" if value is None else _shown(value)))
        return f"{part} is {shown}" + (f" ({'; '.join(values)})" if values else "")
    return f"{text} holds"


def _shown(value: Any) -> str:
    if isinstance(value, classad2.ExprTree):
        return str(value)
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "{" + ", ".join(_shown(v) for v in value) + "}"
    return str(value)


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> classad2.ExprTree:
    return classad2.ExprTree(text)


@functools.lru_cache(maxsize=1024)
def _accepted(text: str) -> Analysis | None:
    """The analysis of an expression to evaluate; None (and a warning, once per process) if
    its cost is not bounded: one stored before the limits existed."""
    try:
        return analyse(text)
    except ExpressionError as exc:
        log.warning("Requirements expression not evaluated, it matches nothing: it %s: %s",
                    exc, text[:200])
        return None


_too_slow: set[str] = set()


def _timed(text: str, target: classad2.ClassAd) -> bool:
    clock = Stopwatch()
    verdict = evaluates_true(text, target)
    spent = clock.over(EVALUATION_BUDGET)
    if spent is not None:
        _too_slow.add(text)
        log.warning("Requirements expression took %.3f s of CPU time to evaluate (budget "
                    "%.3f s); it is not evaluated again and matches nothing: %s", spent,
                    EVALUATION_BUDGET, text[:200])
    return verdict


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class _Verdicts:
    """A bounded, thread-safe LRU of expression verdicts."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, tuple[tuple[str, Any], ...]], bool] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, tuple[tuple[str, Any], ...]]) -> bool | None:
        with self._lock:
            verdict = self._items.get(key)
            if verdict is not None:
                self._items.move_to_end(key)
            return verdict

    def put(self, key: tuple[str, tuple[tuple[str, Any], ...]], verdict: bool) -> None:
        with self._lock:
            self._items[key] = verdict
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_verdicts = _Verdicts(VERDICTS_KEPT)
