"""Reading JDL (ClassAd) job descriptions with HTCondor's ``classad2``, strictly and safely.

The ClassAd library silently ignores trailing text, gives one message without a position for
every syntax error, and can crash on huge expressions; so the text is size-capped first, parsed
with ``ExprTree(text).eval()`` (which refuses trailing text), and when it does not parse, each
top-level attribute is tried on its own to say on which line the error is.
"""

from __future__ import annotations

import os
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

# The bindings read an HTCondor configuration at import; gridpilot needs none.
os.environ.setdefault("CONDOR_CONFIG", "/dev/null")
import classad2


def parse_jdl(text: str) -> list[JobDescription]:
    """The jobs a JDL describes: one, or one per parameter of a parametric JDL."""
    ad = read_classad(text)
    raw: Raw = {}
    extra: dict[str, JSONValue] = {}
    for key in ad:
        name = canonical_name(key)
        if name is None:
            extra[key] = _plain(ad, key)
            continue
        if name in raw:
            raise JobDescriptionError(
                f"{key} and {raw[name][0]} name the same field; give it once", key)
        raw[name] = (key, _field_value(ad, key, name))
    return build_descriptions(raw, extra)


def read_classad(text: str) -> classad2.ClassAd:
    """Parse untrusted ClassAd text into a ClassAd, or raise a JobDescriptionError."""
    if not isinstance(text, str):
        raise JobDescriptionError(f"a JDL must be text, got {type(text).__name__}")
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_DESCRIPTION_BYTES:
        raise JobDescriptionError(
            f"the JDL is {size} bytes long; at most {MAX_DESCRIPTION_BYTES} are accepted")
    if "\x00" in text:
        raise JobDescriptionError("the JDL contains a NUL character")
    body = text.strip()
    if not body:
        raise JobDescriptionError("the JDL is empty")
    candidates = [body] if body.startswith("[") else [f"[{body}\n]", body]
    for candidate in candidates:
        try:
            value = classad2.ExprTree(candidate).eval()
        except classad2.ClassAdException:
            continue
        if isinstance(value, classad2.ClassAd):
            return value
    raise JobDescriptionError(_syntax_error(body))


def _syntax_error(body: str) -> str:
    inner = body[1:-1] if body.startswith("[") and body.endswith("]") else body
    if body.startswith("[") and not body.rstrip().endswith("]"):
        return "the JDL is not valid ClassAd syntax: the opening '[' is never closed"
    offset = body.index(inner) if inner in body else 0
    for start, segment in _top_level_segments(inner):
        if not segment.strip():
            continue
        try:
            classad2.ExprTree(f"[{segment}\n]").eval()
        except classad2.ClassAdException:
            line = body.count("\n", 0, offset + start) + 1 + _leading_newlines(segment)
            shown = " ".join(segment.split())
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            return (f"the JDL is not valid ClassAd syntax at line {line}: cannot read "
                    f"\"{shown}\" (expected Name = value; with strings in double quotes and "
                    "lists in { })")
    return ("the JDL is not valid ClassAd syntax: check for a missing ';' between attributes "
            "or an unbalanced quote, bracket or brace")


def _leading_newlines(segment: str) -> int:
    stripped = segment.lstrip()
    return segment[: len(segment) - len(stripped)].count("\n")


def _top_level_segments(text: str) -> list[tuple[int, str]]:
    """Split at ';' outside quotes, brackets, braces, parentheses and comments."""
    segments: list[tuple[int, str]] = []
    depth = 0
    start = 0
    i = 0
    quote = False
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == '"':
                quote = False
        elif c == '"':
            quote = True
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = len(text) if end < 0 else end + 2
            continue
        elif c in "[{(":
            depth += 1
        elif c in "]})":
            depth -= 1
        elif c == ";" and depth == 0:
            segments.append((start, text[start:i]))
            start = i + 1
        i += 1
    segments.append((start, text[start:]))
    return segments


def _field_value(ad: classad2.ClassAd, key: str, name: str) -> Any:
    if name == "Requirements":
        value = ad.eval(key)
        if isinstance(value, classad2.ClassAd):
            return {k: _data(value, k, f"{key}.{k}") for k in value}
        if value is True:
            return {}  # "Requirements = true": no requirement at all
        return Expression(str(ad.lookup(key)))
    return _data(ad, key, key)


def _data(ad: classad2.ClassAd, key: str, label: str) -> Any:
    """The evaluated value of an attribute, as plain Python data."""
    value = ad.eval(key)
    if isinstance(value, classad2.Value):
        raise JobDescriptionError(
            f"{label} = {ad.lookup(key)} cannot be evaluated: it refers to an attribute that "
            "is not defined (text values need double quotes)", label)
    return _convert(value, label)


def _convert(value: Any, label: str) -> Any:
    if isinstance(value, classad2.ClassAd):
        return {k: _convert(value.eval(k), f"{label}.{k}") for k in value}
    if isinstance(value, list):
        return [_convert(v, label) for v in value]
    if isinstance(value, classad2.Value):
        raise JobDescriptionError(f"{label} holds a value that is not defined", label)
    if isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _plain(ad: classad2.ClassAd, key: str) -> JSONValue:
    """An unknown field for the payload: its value, or its expression's text."""
    value = ad.eval(key)
    if isinstance(value, classad2.Value):
        return str(ad.lookup(key))
    try:
        converted: JSONValue = _convert(value, key)
    except JobDescriptionError:
        return str(ad.lookup(key))
    return converted
