"""Reading JDL (ClassAd) job descriptions with HTCondor's ``classad2``, strictly and safely.

The ClassAd library is lenient and fragile with untrusted text: it drops text after a stray
``]``, keeps the last of two attributes with the same name, reads integers beyond 2**63-1 as 0,
gives one message without a position for every syntax error, and can crash on self-referring or
huge expressions. So before the library sees a JDL, gridpilot checks it itself on a copy whose
strings and comments are blanked out (optimizers.jdltext): size, encoding, one outer ``[ ]``
with nothing after it, each attribute named once, integers in range. Evaluation is depth-limited
and every library exception becomes a :class:`JobDescriptionError` naming the field.

The library evaluates an attribute anew at each reference to it, so attributes that refer to
each other (``X1 = X0 + X0; X2 = X1 + X1; ...``) cost time exponential in their number. So
:func:`_resolve` evaluates the attributes of an ad once each, those an attribute refers to
first, and stores each value in place of its expression; attributes that refer to each other
in a cycle are an error. Every value built counts against a :class:`_Budget` (characters per
value and in all, and milliseconds of CPU time per description): past it the JDL is refused,
naming the attribute.
"""

from __future__ import annotations

import os
import re
from typing import Any

from optimizers.cputime import Stopwatch
from optimizers.description import (
    MAX_DESCRIPTION_BYTES,
    Expression,
    JobDescription,
    JobDescriptionError,
    JSONValue,
    Raw,
    build_descriptions,
    canonical_name,
)
from optimizers.expressions import ExpressionError, attributes_read
from optimizers.jdltext import (
    EXPRESSIONS,
    NAME,
    code_only,
    depths,
    dirac_forms,
    segments,
    without_comments,
)

# The bindings read an HTCondor configuration at import; gridpilot needs none.
os.environ.setdefault("CONDOR_CONFIG", "/dev/null")
import classad2

#: Deepest nesting of sections and lists accepted (a self-reference would be endless).
MAX_DEPTH = 16
_MAX_INT = 2**63 - 1
_BIG_INT = re.compile(r"(?<![\w.])\d{19,}(?![\w.])")
#: Largest value one attribute may build (characters of its text, items of its lists).
MAX_VALUE_CHARS = MAX_DESCRIPTION_BYTES
#: Largest total of the values the attributes of one description build.
MAX_BUILT_CHARS = 4 * MAX_DESCRIPTION_BYTES
#: Most CPU time the evaluation of one description may take, in milliseconds (the evaluating
#: thread's own: optimizers.cputime).
EVALUATION_BUDGET_MS = 500
#: A name an expression refers to, with the name after its first dot (``my.X``, ``S.A``).
_REFERENCE = re.compile(r"(?<![\w.])([A-Za-z_]\w*)(?:\s*\.\s*([A-Za-z_]\w*))?")
_OTHER_SCOPES = frozenset({"other", "target", "parent"})
_OWN_SCOPES = frozenset({"my", "self", "root"})


class _OverBudget(JobDescriptionError):
    """A description whose evaluation exceeds its :class:`_Budget`."""


class _Budget:
    """What the evaluation of one description has spent so far, and what it learnt: the
    original text of each top-level attribute (its value replaces it in the ad) and why an
    attribute cannot be evaluated."""

    def __init__(self) -> None:
        self.clock = Stopwatch()
        self.built = 0
        self.texts: dict[str, str] = {}
        self.refused: dict[str, str] = {}

    def spend(self, label: str, size: int) -> None:
        if size > MAX_VALUE_CHARS:
            raise _OverBudget(
                f"{label} builds a value of {size} characters; at most {MAX_VALUE_CHARS} are "
                "accepted (does it repeat attributes that themselves repeat others?)", label)
        self.built += size
        if self.built > MAX_BUILT_CHARS:
            raise _OverBudget(
                f"{label}: the attributes of the JDL build values of more than "
                f"{MAX_BUILT_CHARS} characters in all; at most that many are accepted", label)
        spent = self.clock.over(EVALUATION_BUDGET_MS / 1000)
        if spent is not None:
            raise _OverBudget(
                f"{label}: evaluating the JDL took {spent * 1000:.0f} ms of CPU time up to this "
                f"attribute; at most {EVALUATION_BUDGET_MS} ms are allowed (do its attributes "
                "refer to each other many times?)", label)


def parse_jdl(text: str) -> list[JobDescription]:
    """The jobs a JDL describes: one, or one per parameter of a parametric JDL."""
    ad, renamed = read_classad(text)
    budget = _Budget()
    _resolve(ad, budget, "", 0, renamed)
    raw: Raw = {}
    extra: dict[str, JSONValue] = {}
    for key in ad:
        label = renamed.get(key, key)
        name = canonical_name(label)
        if name is None:
            extra[label] = _plain(ad, key, label, budget)
            continue
        if name in raw:
            raise JobDescriptionError(
                f"{label} and {raw[name][0]} name the same field; give it once", label)
        raw[name] = (label, _field_value(ad, key, name, label, budget))
    return build_descriptions(raw, extra)


def read_classad(text: str) -> tuple[classad2.ClassAd, dict[str, str]]:
    """Parse untrusted JDL text into a ClassAd, or raise a JobDescriptionError; with the
    original of each dotted name the ad holds under another name (optimizers.jdltext)."""
    if not isinstance(text, str):
        raise JobDescriptionError(f"a JDL must be text, got {type(text).__name__}")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        raise JobDescriptionError(
            f"the JDL contains a character that is not valid Unicode (a lone surrogate) at "
            f"line {line}") from exc
    if size > MAX_DESCRIPTION_BYTES:
        raise JobDescriptionError(
            f"the JDL is {size} bytes long; at most {MAX_DESCRIPTION_BYTES} are accepted")
    if "\x00" in text:
        raise JobDescriptionError("the JDL contains a NUL character")
    code = code_only(text)
    if not code.strip():
        raise JobDescriptionError("the JDL is empty" + (" (it holds only comments)"
                                                        if text.strip() else ""))
    hint = " (a ']' inside a // comment does not count)" if "//" in text else ""
    ad_text, ad_code = _outer_ad(without_comments(text), code, hint)
    _check_attributes(ad_text, ad_code)
    ad_text, renamed = dirac_forms(ad_text, ad_code)
    try:
        value = classad2.ExprTree(ad_text).eval()
    except classad2.ClassAdException:
        value = None
    if not isinstance(value, classad2.ClassAd):
        raise JobDescriptionError(_syntax_error(ad_text))
    return value, renamed


def _outer_ad(text: str, code: str, hint: str) -> tuple[str, str]:
    """The text of the one ClassAd, and its blanked form: ``[ … ]`` as given (nothing may
    follow it), or the bare attribute list wrapped in brackets."""
    start = len(code) - len(code.lstrip())
    if not code.startswith("[", start):
        stray = next((i for i, _c, depth in depths(code) if depth < 0), None)
        if stray is not None:
            raise JobDescriptionError(
                f"the JDL has an unmatched '{code[stray]}' at line {_line(text, stray)}")
        return f"[{text}\n]", f"[{code}\n]"
    for i, c, depth in depths(code):
        if depth == 0 and c in "]})":
            rest = code[i + 1:]
            if rest.strip():
                at = i + 1 + len(rest) - len(rest.lstrip())
                shown = " ".join(text[at:].split())[:40]
                raise JobDescriptionError(
                    f"the JDL has text after its closing ']' at line {_line(text, at)}: "
                    f"\"{shown}\" (every attribute belongs inside the [ ])")
            return text[start:i + 1], code[start:i + 1]
    located = _locate_error(text, start + 1, len(text))
    raise JobDescriptionError(
        located or f"the JDL is not valid ClassAd syntax: the opening '[' is never closed{hint}")


def _line(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _check_attributes(ad_text: str, code: str) -> None:
    """Each top-level attribute once (names are case-insensitive), integers in range."""
    offset = 1
    inner = code[offset:-1]
    seen: dict[str, str] = {}
    for a, b in segments(inner):
        m = NAME.match(inner[a:b])
        if m is None:
            continue  # the syntax check reports it
        name = m.group(1)
        if name.lower() in seen:
            raise JobDescriptionError(
                f"{name} is given twice (as {seen[name.lower()]} before, at line "
                f"{_line(ad_text, offset + a + m.start(1))}); attribute names are "
                "case-insensitive: give it once", name)
        seen[name.lower()] = name
    for m in _BIG_INT.finditer(code):
        if int(m.group()) > _MAX_INT:
            raise JobDescriptionError(
                f"the number {m.group()[:25]}{'...' if len(m.group()) > 25 else ''} at line "
                f"{_line(ad_text, m.start())} is too large (at most {_MAX_INT})")


def _syntax_error(ad_text: str) -> str:
    return _locate_error(ad_text, 1, len(ad_text) - 1) or (
        "the JDL is not valid ClassAd syntax: check for a missing ';' between attributes or an "
        "unbalanced quote, bracket or brace")


def _locate_error(text: str, begin: int, end: int) -> str | None:
    """The first top-level attribute of ``text[begin:end]`` that does not parse on its own,
    with its line, or None."""
    code = code_only(text)[begin:end]
    inner = text[begin:end]
    for a, b in segments(code):
        try:
            classad2.ExprTree(f"[{inner[a:b]}\n]").eval()
        except classad2.ClassAdException:
            first = a + len(code[a:b]) - len(code[a:b].lstrip())
            shown = " ".join(inner[first:b].split())
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            return (f"the JDL is not valid ClassAd syntax at line {_line(text, begin + first)}:"
                    f" cannot read \"{shown}\" (expected Name = value; with strings in double "
                    "quotes and lists in { })")
    return None


def _evaluate(ad: classad2.ClassAd, key: str, label: str, budget: _Budget) -> Any:
    if label in budget.refused:
        raise JobDescriptionError(budget.refused[label], label)
    try:
        return ad.eval(key)
    except classad2.ClassAdException as exc:
        raise JobDescriptionError(_too_long(label), label) from exc


def _too_long(label: str) -> str:
    return f"{label} cannot be evaluated: the expression is too long or too deeply nested"


def _resolve(ad: classad2.ClassAd, budget: _Budget, prefix: str, depth: int,
             renamed: dict[str, str] | None = None) -> None:
    """Evaluate each attribute of ``ad`` once, those it refers to first, and store its value
    in its place (sections are resolved likewise, down to :data:`MAX_DEPTH`), so that no
    reference is evaluated twice. At the top level Requirements and Rank stay expressions
    (they are read against the resource) and the original texts are kept in ``budget``."""
    texts = {key: str(ad.lookup(key)) for key in ad}
    order, cyclic = _evaluation_order(texts)
    for key in order:
        label = prefix + (renamed or {}).get(key, key)
        budget.texts[label] = texts[key]
        if depth == 0 and key.lower() in EXPRESSIONS:
            continue
        if key in cyclic:
            budget.refused[label] = (
                f"{label} cannot be evaluated: it refers to itself through other attributes "
                f"({', '.join([n for n in cyclic[key] if n != key][:5])})")
            ad[key] = classad2.Value.Error
            continue
        try:
            value = ad.eval(key)
        except classad2.ClassAdException:
            budget.refused[label] = _too_long(label)
            ad[key] = classad2.Value.Error
            continue
        if isinstance(value, classad2.ClassAd):
            if depth >= MAX_DEPTH:  # unresolved, a reference into it would cost as before
                budget.refused[label] = _too_deep(label)
                ad[key] = classad2.Value.Error
                continue
            _resolve(value, budget, f"{label}.", depth + 1)
        budget.spend(label, _size(value))
        ad[key] = value


def _too_deep(label: str) -> str:
    return (f"{label} nests too deeply (a name such as ROOT or self without quotes refers to "
            "the job itself; text values need double quotes)")


def _evaluation_order(texts: dict[str, str]) -> tuple[list[str], dict[str, list[str]]]:
    """The attributes, each after those it may refer to (a name in its text, strings aside),
    and those that refer to each other in a cycle, with a few names of their cycle (Tarjan's
    strongly connected components, in time linear in the references). A reference to itself
    is left to the library, which finds it at once."""
    lower = {key.lower(): key for key in texts}
    refers = {key: sorted(_references(text, lower) - {key}) for key, text in texts.items()}
    order: list[str] = []
    cyclic: dict[str, list[str]] = {}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in texts:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(refers[root]))]
        while work:
            node, pending = work[-1]
            nxt = next(pending, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(refers[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] != index[node]:
                continue
            component: list[str] = []
            while True:  # a component comes after every one it refers to
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            order.extend(component)
            if len(component) > 1:
                names = sorted(component)[:6]
                for member in component:
                    cyclic[member] = names
    return order, cyclic


def _references(text: str, lower: dict[str, str]) -> set[str]:
    """The attributes (keys of ``lower``, by lower-case name) that ``text`` may refer to."""
    found: set[str] = set()
    for m in _REFERENCE.finditer(code_only(text)):
        first, second = m.group(1).lower(), m.group(2)
        if first in _OTHER_SCOPES:
            continue
        if first in _OWN_SCOPES and second is not None:
            first = second.lower()
        if first in lower:
            found.add(lower[first])
    return found


def _size(value: Any) -> int:
    """The characters a value holds (a list's items and a section's text counted)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return 1 + sum(_size(v) for v in value)
    if isinstance(value, classad2.ClassAd | classad2.ExprTree):
        return len(str(value))
    return 1


def _text(ad: classad2.ClassAd, key: str, label: str, budget: _Budget) -> str:
    """The expression of an attribute as written (:func:`_resolve` replaced it by its value)."""
    text = budget.texts.get(label)
    return str(ad.lookup(key)) if text is None else text


def _field_value(ad: classad2.ClassAd, key: str, name: str, label: str,
                 budget: _Budget) -> Any:
    if name == "Requirements":
        value = _evaluate(ad, key, label, budget)
        if isinstance(value, bool) and _reads_resource(_text(ad, key, label, budget)):
            # Evaluated here with no resource, other.Name is undefined: "other.A == 1 ||
            # other.B is undefined" comes out true and "... && other.B isnt undefined"
            # false. What reads the resource is decided at match time, not now.
            return Expression(_text(ad, key, label, budget))
        if isinstance(value, classad2.ClassAd):
            _resolve(value, budget, f"{label}.", 1)
            return {k: _data(value, k, f"{label}.{k}", 1, budget) for k in value}
        if value is True:
            return {}  # "Requirements = true": no requirement at all
        if value is False:
            raise JobDescriptionError(
                f"{label} = false: no resource could ever run this job", label)
        if isinstance(value, classad2.Value):
            return Expression(_text(ad, key, label, budget))  # refers to the resource: other.*
        raise JobDescriptionError(
            f"{label} must be a section of requirements ([ Name = value; ... ]) or a ClassAd "
            f"expression such as other.MaxRAM >= 2000 (not in quotes), got {ad.lookup(key)}",
            label)
    return _data(ad, key, label, 0, budget)


def _reads_resource(expression: str) -> bool:
    """Whether ``expression`` names an attribute of the resource (other.X or target.X)."""
    try:
        names = attributes_read(expression)
    except ExpressionError:
        return False  # not an expression the matcher could evaluate: refused as before
    return any(n.split(".", 1)[0].lower() in ("other", "target") for n in names)


def _data(ad: classad2.ClassAd, key: str, label: str, depth: int, budget: _Budget) -> Any:
    """The evaluated value of an attribute, as plain Python data."""
    value = _evaluate(ad, key, label, budget)
    if isinstance(value, classad2.Value):
        raise JobDescriptionError(_unevaluable(label, _text(ad, key, label, budget), value),
                                  label)
    return _convert(value, label, ad, depth, budget)


def _unevaluable(label: str, expression: str, value: classad2.Value) -> str:
    if value == classad2.Value.Error:
        return (f"{label} = {expression} cannot be evaluated: it is an error (a division by "
                "zero, or text used as a number?)")
    return (f"{label} = {expression} cannot be evaluated: it refers to an attribute that is "
            "not defined (text values need double quotes)")


def _convert(value: Any, label: str, scope: classad2.ClassAd, depth: int,
             budget: _Budget) -> Any:
    budget.spend(label, _size(value) if isinstance(value, str) else 1)
    if depth > MAX_DEPTH:
        raise JobDescriptionError(_too_deep(label), label)
    if isinstance(value, classad2.ClassAd):
        _resolve(value, budget, f"{label}.", depth + 1)
        return {k: _convert(_evaluate(value, k, f"{label}.{k}", budget), f"{label}.{k}", value,
                            depth + 1, budget) for k in value}
    if isinstance(value, classad2.ExprTree):
        # A list's items come back unevaluated unless they are literals.
        try:
            item = value.eval(scope=scope)
        except classad2.ClassAdException as exc:
            raise JobDescriptionError(f"{label} holds an item that cannot be evaluated",
                                      label) from exc
        if isinstance(item, classad2.Value):
            raise JobDescriptionError(_unevaluable(label, str(value), item), label)
        return _convert(item, label, scope, depth + 1, budget)
    if isinstance(value, list):
        return [_convert(v, label, scope, depth + 1, budget) for v in value]
    if isinstance(value, classad2.Value):
        raise JobDescriptionError(f"{label} holds a value that is not defined", label)
    if isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _plain(ad: classad2.ClassAd, key: str, label: str, budget: _Budget) -> JSONValue:
    """An unknown field for the payload: its value, or its expression's one-line text."""
    try:
        value = _evaluate(ad, key, label, budget)
        if not isinstance(value, classad2.Value):
            converted: JSONValue = _convert(value, label, ad, 0, budget)
            return converted
    except _OverBudget:
        raise
    except (classad2.ClassAdException, JobDescriptionError):
        pass
    return " ".join(_text(ad, key, label, budget).split())
