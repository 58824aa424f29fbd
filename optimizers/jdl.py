"""Reading JDL (ClassAd) job descriptions with HTCondor's ``classad2``, strictly and safely.

The ClassAd library is lenient and fragile with untrusted text: it drops text after a stray
``]``, keeps the last of two attributes with the same name, reads integers beyond 2**63-1 as 0,
gives one message without a position for every syntax error, and can crash on self-referring or
huge expressions. So before the library sees a JDL, gridpilot checks it itself on a copy whose
strings and comments are blanked out (optimizers.jdltext): size, encoding, one outer ``[ ]``
with nothing after it, each attribute named once, integers in range. Evaluation is depth-limited
and every library exception becomes a :class:`JobDescriptionError` naming the field.
"""

from __future__ import annotations

import os
import re
from typing import Any

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
from optimizers.jdltext import NAME, code_only, depths, dirac_forms, segments, without_comments

# The bindings read an HTCondor configuration at import; gridpilot needs none.
os.environ.setdefault("CONDOR_CONFIG", "/dev/null")
import classad2

#: Deepest nesting of sections and lists accepted (a self-reference would be endless).
MAX_DEPTH = 16
_MAX_INT = 2**63 - 1
_BIG_INT = re.compile(r"(?<![\w.])\d{19,}(?![\w.])")


def parse_jdl(text: str) -> list[JobDescription]:
    """The jobs a JDL describes: one, or one per parameter of a parametric JDL."""
    ad, renamed = read_classad(text)
    raw: Raw = {}
    extra: dict[str, JSONValue] = {}
    for key in ad:
        label = renamed.get(key, key)
        name = canonical_name(label)
        if name is None:
            extra[label] = _plain(ad, key, label)
            continue
        if name in raw:
            raise JobDescriptionError(
                f"{label} and {raw[name][0]} name the same field; give it once", label)
        raw[name] = (label, _field_value(ad, key, name, label))
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


def _evaluate(ad: classad2.ClassAd, key: str, label: str) -> Any:
    try:
        return ad.eval(key)
    except classad2.ClassAdException as exc:
        raise JobDescriptionError(
            f"{label} cannot be evaluated: the expression is too long or too deeply nested",
            label) from exc


def _field_value(ad: classad2.ClassAd, key: str, name: str, label: str) -> Any:
    if name == "Requirements":
        value = _evaluate(ad, key, label)
        if isinstance(value, bool) and _reads_resource(str(ad.lookup(key))):
            # Evaluated here with no resource, other.Name is undefined: "other.A == 1 ||
            # other.B is undefined" comes out true and "... && other.B isnt undefined"
            # false. What reads the resource is decided at match time, not now.
            return Expression(str(ad.lookup(key)))
        if isinstance(value, classad2.ClassAd):
            return {k: _data(value, k, f"{label}.{k}", 1) for k in value}
        if value is True:
            return {}  # "Requirements = true": no requirement at all
        if value is False:
            raise JobDescriptionError(
                f"{label} = false: no resource could ever run this job", label)
        if isinstance(value, classad2.Value):
            return Expression(str(ad.lookup(key)))  # refers to the resource: other.*
        raise JobDescriptionError(
            f"{label} must be a section of requirements ([ Name = value; ... ]) or a ClassAd "
            f"expression such as other.MaxRAM >= 2000 (not in quotes), got {ad.lookup(key)}",
            label)
    return _data(ad, key, label, 0)


def _reads_resource(expression: str) -> bool:
    """Whether ``expression`` names an attribute of the resource (other.X or target.X)."""
    try:
        names = attributes_read(expression)
    except ExpressionError:
        return False  # not an expression the matcher could evaluate: refused as before
    return any(n.split(".", 1)[0].lower() in ("other", "target") for n in names)


def _data(ad: classad2.ClassAd, key: str, label: str, depth: int) -> Any:
    """The evaluated value of an attribute, as plain Python data."""
    value = _evaluate(ad, key, label)
    if isinstance(value, classad2.Value):
        raise JobDescriptionError(_unevaluable(label, str(ad.lookup(key)), value), label)
    return _convert(value, label, ad, depth)


def _unevaluable(label: str, expression: str, value: classad2.Value) -> str:
    if value == classad2.Value.Error:
        return (f"{label} = {expression} cannot be evaluated: it is an error (a division by "
                "zero, or text used as a number?)")
    return (f"{label} = {expression} cannot be evaluated: it refers to an attribute that is "
            "not defined (text values need double quotes)")


def _convert(value: Any, label: str, scope: classad2.ClassAd, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise JobDescriptionError(
            f"{label} nests too deeply (a name such as ROOT or self without quotes refers to "
            "the job itself; text values need double quotes)", label)
    if isinstance(value, classad2.ClassAd):
        return {k: _convert(_evaluate(value, k, f"{label}.{k}"), f"{label}.{k}", value,
                            depth + 1) for k in value}
    if isinstance(value, classad2.ExprTree):
        # A list's items come back unevaluated unless they are literals.
        try:
            item = value.eval(scope=scope)
        except classad2.ClassAdException as exc:
            raise JobDescriptionError(f"{label} holds an item that cannot be evaluated",
                                      label) from exc
        if isinstance(item, classad2.Value):
            raise JobDescriptionError(_unevaluable(label, str(value), item), label)
        return _convert(item, label, scope, depth + 1)
    if isinstance(value, list):
        return [_convert(v, label, scope, depth + 1) for v in value]
    if isinstance(value, classad2.Value):
        raise JobDescriptionError(f"{label} holds a value that is not defined", label)
    if isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _plain(ad: classad2.ClassAd, key: str, label: str) -> JSONValue:
    """An unknown field for the payload: its value, or its expression's one-line text."""
    try:
        value = ad.eval(key)
        if not isinstance(value, classad2.Value):
            converted: JSONValue = _convert(value, label, ad, 0)
            return converted
    except (classad2.ClassAdException, JobDescriptionError):
        pass
    return " ".join(str(ad.lookup(key)).split())
