"""What a Requirements expression may contain, so that evaluating it is always cheap.

A job's ClassAd expression is evaluated for every pilot of the VO that draws its task queue,
in the matcher's request: one user's expression must not be able to slow every match. So an
expression is read here (without the ClassAd library) before it is accepted, and refused when
its cost is not bounded:

- at most :data:`MAX_EXPRESSION_BYTES` bytes, :data:`MAX_BOOLEAN_OPERATORS` ``&&``/``||``,
  :data:`MAX_FUNCTION_CALLS` function calls (of which :data:`MAX_REGEXPS` regular
  expressions), nested at most :data:`MAX_NESTING` deep;
- attributes are the resource's only: ``other.Name`` or ``target.Name`` (the job's own
  attributes are fixed when it is submitted, and a bare name is undefined at match time);
- functions from :data:`FUNCTIONS` only (no user-defined or library-loaded ones);
- no nested ClassAds or subscripts (``[ ... ]``), which can refer to themselves;
- a regular expression is a string constant of at most :data:`MAX_PATTERN_CHARS` characters
  with no back-reference and no repeated group that itself repeats or alternates (``(a+)+``,
  ``(a|aa)*``): the patterns that make a backtracking matcher take exponential time;
- integers fit in 64 bits (the ClassAd library reads larger ones as 0).

:func:`analyse` returns the attributes the expression reads, so that a verdict can be
remembered per expression and per values of just those attributes (see optimizers.classads).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

MAX_EXPRESSION_BYTES = 8 * 1024
MAX_BOOLEAN_OPERATORS = 64
MAX_FUNCTION_CALLS = 32
MAX_REGEXPS = 4
MAX_NESTING = 16
MAX_PATTERN_CHARS = 256
_MAX_INT = 2**63 - 1

#: Functions an expression may call (lower case; ClassAd function names ignore case).
FUNCTIONS = frozenset({
    "member", "identicalmember", "anycompare", "allcompare", "size", "strcat", "substr",
    "tolower", "toupper", "strcmp", "stricmp", "int", "real", "string", "bool", "floor",
    "ceiling", "round", "min", "max", "sum", "avg", "abs", "ifthenelse", "isundefined",
    "iserror", "isstring", "isinteger", "isreal", "isboolean", "islist", "isclassad",
    "stringlistmember", "stringlistimember", "stringlistsize", "stringlistsubsetmatch",
    "stringlistisubsetmatch", "versioncmp", "version_gt", "version_ge", "version_lt",
    "version_le", "version_eq", "version_in_range", "regexp", "regexpmember",
    "stringlist_regexpmember",
})
#: Functions whose first argument is a regular expression.
REGEXP_FUNCTIONS = frozenset({"regexp", "regexpmember", "stringlist_regexpmember"})
_KEYWORDS = frozenset({"true", "false", "undefined", "error", "is", "isnt"})
_SCOPES = frozenset({"other", "target"})

_TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<op>=\?=|=!=|&&|\|\||==|!=|<=|>=|>>>|<<|>>|[-+*/%<>!?:(){},&|^~])
""", re.VERBOSE | re.DOTALL)


class ExpressionError(ValueError):
    """An expression is refused; the message says what is wrong and how to write it."""


@dataclass(frozen=True)
class Analysis:
    #: Names (lower case) of the resource attributes the expression reads.
    attributes: frozenset[str]
    boolean_operators: int
    function_calls: int


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    start: int = 0


def analyse(text: str) -> Analysis:
    """Check an expression's cost and names; raise ExpressionError if it is refused."""
    return _analyse(text)


@functools.lru_cache(maxsize=1024)
def _analyse(text: str) -> Analysis:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_EXPRESSION_BYTES:
        raise ExpressionError(
            f"is {size} bytes long; at most {MAX_EXPRESSION_BYTES} are accepted")
    tokens = list(_tokens(text))
    attributes: set[str] = set()
    booleans = calls = regexps = depth = 0
    for i, token in enumerate(tokens):
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        if token.kind == "op":
            if token.text in ("&&", "||"):
                booleans += 1
            elif token.text in ("(", "{"):
                depth += 1
                if depth > MAX_NESTING:
                    raise ExpressionError(
                        f"nests parentheses or lists more than {MAX_NESTING} deep")
            elif token.text in (")", "}"):
                depth -= 1
        elif token.kind == "number":
            if re.fullmatch(r"\d+", token.text) and int(token.text) > _MAX_INT:
                raise ExpressionError(f"holds the integer {token.text}, larger than 2^63-1")
        elif token.kind == "name":
            name = re.sub(r"\s+", "", token.text)
            if following is not None and following.text == "(":
                function = name.lower()
                if function not in FUNCTIONS:
                    raise ExpressionError(
                        f"calls {name}(), which is not accepted; the accepted functions are "
                        + ", ".join(sorted(FUNCTIONS)))
                calls += 1
                if function in REGEXP_FUNCTIONS:
                    regexps += 1
                    _check_pattern_argument(name, tokens[i + 2:i + 4])
            elif name.lower() not in _KEYWORDS:
                attributes.add(_attribute(name))
    if booleans > MAX_BOOLEAN_OPERATORS:
        raise ExpressionError(
            f"has {booleans} && and || operators; at most {MAX_BOOLEAN_OPERATORS} are accepted "
            "(to accept any of many values, use member(other.Name, {\"a\", \"b\", ...}))")
    if calls > MAX_FUNCTION_CALLS:
        raise ExpressionError(
            f"calls {calls} functions; at most {MAX_FUNCTION_CALLS} calls are accepted")
    if regexps > MAX_REGEXPS:
        raise ExpressionError(
            f"uses {regexps} regular expressions; at most {MAX_REGEXPS} are accepted")
    return Analysis(frozenset(attributes), booleans, calls)


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            what = "[ ]: nested ClassAds and subscripts are not accepted" if text[pos] in "[]" \
                else repr(text[pos])
            raise ExpressionError(f"holds {what} at character {pos + 1}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            out.append(_Token(kind, match.group(), pos))
        pos = match.end()
    return out


def conjuncts(text: str) -> list[str]:
    """The parts of ``a && b && c`` joined at the top level (one part when the top level is
    anything else: ``||``, ``? :``), as they are written."""
    tokens = _tokens(text)
    depth = 0
    cuts: list[_Token] = []
    for token in tokens:
        if token.kind != "op":
            continue
        if token.text in ("(", "{"):
            depth += 1
        elif token.text in (")", "}"):
            depth -= 1
        elif depth == 0 and token.text in ("||", "?"):
            return [text.strip()]
        elif depth == 0 and token.text == "&&":
            cuts.append(token)
    parts, start = [], 0
    for cut in cuts:
        parts.append(text[start:cut.start].strip())
        start = cut.start + 2
    parts.append(text[start:].strip())
    return parts


def attributes_read(text: str) -> list[str]:
    """The resource attributes an expression names, as written (other.X), in order."""
    seen: list[str] = []
    tokens = _tokens(text)
    for i, token in enumerate(tokens):
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        if token.kind == "name" and (following is None or following.text != "("):
            name = re.sub(r"\s+", "", token.text)
            if "." in name and name not in seen:
                seen.append(name)
    return seen


def _attribute(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 2 and parts[0].lower() in _SCOPES:
        return parts[1].lower()
    last = parts[-1]
    raise ExpressionError(
        f"refers to {name}, which is not an attribute of the resource: name the resource's "
        f"attributes as other.{last} (for example other.Site, other.Tags, other.MaxRAM)")


def _check_pattern_argument(function: str, after: list[_Token]) -> None:
    if len(after) < 2 or after[0].kind != "string" or after[1].text != ",":
        raise ExpressionError(
            f"calls {function}() with a pattern that is not a string constant; write the "
            "pattern as a quoted string")
    pattern = re.sub(r"\\(.)", r"\1", after[0].text[1:-1])
    reason = pattern_problem(pattern)
    if reason is not None:
        raise ExpressionError(f"calls {function}() with the pattern \"{pattern}\": {reason}")


def pattern_problem(pattern: str) -> str | None:
    """Why a regular expression could take exponential time to match, or None."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"it is {len(pattern)} characters long; at most {MAX_PATTERN_CHARS} are accepted"
    # One frame per open group: [repeats or alternates inside]
    frames: list[list[bool]] = [[False]]
    i = 0
    n = len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1:i + 2]
            if (nxt.isdigit() and nxt != "0") or nxt in ("k", "g"):
                return "back-references are not accepted"
            i += 2
            continue
        if c == "[":
            i = _class_end(pattern, i)
            continue
        if c == "(":
            if pattern.startswith("(?", i):
                rest = pattern[i + 2:i + 4]
                if rest[:1] in (":", "=", "!"):
                    i += 3
                elif rest in ("<=", "<!"):
                    i += 4
                else:
                    return f"the group {pattern[i:i + 4]}... is not accepted"
            else:
                i += 1
            frames.append([False])
            continue
        if c == "|":
            frames[-1][0] = True
            i += 1
            continue
        if c == ")":
            if len(frames) == 1:
                return "it has an unbalanced )"
            inner = frames.pop()[0]
            end, repeats = _quantifier(pattern, i + 1)
            if repeats and inner:
                return ("a repeated group repeats or alternates inside (like (a+)+ or "
                        "(a|aa)*), which can take exponential time; write it without nesting, "
                        "for example with a character class [ab]+")
            if inner or end > i + 1:
                frames[-1][0] = frames[-1][0] or repeats or inner
            i = end
            continue
        end, repeats = _quantifier(pattern, i)
        if end > i:  # a quantifier after a quantifier, or at the start
            frames[-1][0] = frames[-1][0] or repeats
            i = end
            continue
        end, repeats = _quantifier(pattern, i + 1)
        if repeats:
            frames[-1][0] = True
        i = end
    if len(frames) > 1:
        return "it has an unbalanced ("
    return None


def _class_end(pattern: str, start: int) -> int:
    i = start + 1
    if pattern[i:i + 1] == "^":
        i += 1
    if pattern[i:i + 1] == "]":
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


_BRACES = re.compile(r"\{(\d*)(,?)(\d*)\}")


def _quantifier(pattern: str, i: int) -> tuple[int, bool]:
    """Where the quantifier at ``i`` ends (``i`` if there is none), and whether it repeats."""
    c = pattern[i:i + 1]
    if c in ("*", "+"):
        end, repeats = i + 1, True
    elif c == "?":
        end, repeats = i + 1, False
    elif c == "{" and (m := _BRACES.match(pattern, i)) and (m.group(1) or m.group(3)):
        low, comma, high = m.groups()
        repeats = bool(comma and not high) or int(high or low or "0") > 1
        end = m.end()
    else:
        return i, False
    if pattern[end:end + 1] in ("?", "+"):  # lazy or possessive
        end += 1
    return end, repeats
