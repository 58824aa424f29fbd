"""The text of a JDL before the ClassAd library reads it: strings, comments, and the forms of
DIRAC's and gLite's JDLs that are not ClassAd syntax.

Comments are ``//`` and ``#`` to the end of a line and ``/* */`` across lines, outside
strings (gLite's JDLs use ``#``; ClassAd has the others). They are blanked before the library
sees the text.

DIRAC reads a JDL with its own light parser, where a value written without quotes is its text:
its ``Job`` API writes ``JobName = jobName;``, ``StdOutput = std.out;``, ``Site = ANY;`` and
``InputSandbox = {jobDescription.xml, /home/u/run.py};``. :func:`dirac_forms` quotes such
bare words and file names, at the top level of the ad and in its lists (``Requirements`` and
``Rank`` excepted: there ClassAd's meaning stays, ``other.MaxRAM`` is the resource's), and
gives DIRAC's dotted names (``Parameters.A``, ``ParameterStart.A``: named parametric
sequences) a name the library accepts. What is a number, a keyword or arithmetic of numbers
(``3 * 3600``) keeps its ClassAd meaning.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

#: A string, or a comment: ``//`` and ``#`` to the end of the line, ``/* */`` across lines.
_BLANKED = re.compile(r'"(?:\\.|[^"\\])*(?:"|$)|//[^\n]*|#[^\n]*|/\*.*?(?:\*/|$)', re.DOTALL)
_STRUCTURE = re.compile(r"[\[\]{}();]")
#: A name as DIRAC writes it, dots allowed (Parameters.A).
NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=")
#: Attributes whose value is a ClassAd expression evaluated against the resource.
EXPRESSIONS = ("requirements", "rank")
#: Deepest list in a list whose bare words are quoted (the reader refuses deeper nesting).
MAX_LIST_DEPTH = 16
#: The prefix of the name a dotted name is given for the ClassAd library.
DOTTED_PREFIX = "gridpilot_dotted_"

#: A bare word or file name: the characters of names, paths, LFNs, URIs and DIRAC's
#: placeholders (``%s``, ``%(A)s``).
_BARE = re.compile(r"(?:[\w./:@%~+*?=$-]|%\(\w+\)s)+")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_ARITHMETIC = re.compile(r"[\d.eE+\-*/%]+")
_KEYWORDS = frozenset({"true", "false", "undefined", "error"})


def code_only(text: str) -> str:
    """``text`` with the contents of strings and comments blanked (same length, newlines
    kept), so that brackets, semicolons, names and numbers can be found by position."""
    def blank(m: re.Match[str]) -> str:
        found = m.group()
        if "\n" not in found:
            if found.startswith('"'):
                closed = len(found) > 1 and found.endswith('"') and not found.endswith('\\"')
                return '"' + " " * (len(found) - 1 - closed) + ('"' if closed else "")
            return " " * len(found)
        if found.startswith('"'):
            inside = re.sub(r"[^\n]", " ", found[1:-1] if len(found) > 1 and found.endswith('"')
                            and not found.endswith('\\"') else found[1:])
            return '"' + inside + ('"' if len(inside) + 1 < len(found) else "")
        return re.sub(r"[^\n]", " ", found)
    return _BLANKED.sub(blank, text)


def without_comments(text: str) -> str:
    """``text`` with its comments blanked (same length, newlines kept), strings as they are."""
    def blank(m: re.Match[str]) -> str:
        found = m.group()
        return found if found.startswith('"') else re.sub(r"[^\n]", " ", found)
    return _BLANKED.sub(blank, text)


def depths(code: str) -> Iterator[tuple[int, str, int]]:
    """Each bracket, brace, parenthesis and semicolon of blanked code, with the nesting depth
    after it (a regex finds them: a Python loop over every character is several times slower)."""
    depth = 0
    for m in _STRUCTURE.finditer(code):
        c = m.group()
        if c in "[{(":
            depth += 1
        elif c in "]})":
            depth -= 1
        yield m.start(), c, depth


def segments(code: str) -> list[tuple[int, int]]:
    """Spans of the top-level attributes of an ad's inside (split at ';' at depth 0)."""
    spans: list[tuple[int, int]] = []
    start = 0
    for i, c, depth in depths(code):
        if c == ";" and depth == 0:
            spans.append((start, i))
            start = i + 1
    spans.append((start, len(code)))
    return [(a, b) for a, b in spans if code[a:b].strip()]


def dirac_forms(ad_text: str, ad_code: str) -> tuple[str, dict[str, str]]:
    """The ad's text (``[ … ]``, comments blanked) with its bare words quoted and its dotted
    names renamed, and the original of each renamed name. Lines stay where they were."""
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement), in text order
    renamed: dict[str, str] = {}
    inner = ad_code[1:-1]
    for a, b in segments(inner):
        m = NAME.match(inner[a:b])
        if m is None:
            continue  # the syntax check reports it
        name = m.group(1)
        if "." in name:
            new = f"{DOTTED_PREFIX}{len(renamed)}"
            renamed[new] = name
            edits.append((1 + a + m.start(1), 1 + a + m.end(1), new))
        if name.lower() in EXPRESSIONS:
            continue
        start = 1 + a + m.end()
        edits.extend(_bare_values(ad_code, start, 1 + b, top=True, depth=0))
    out = ad_text
    for start, end, replacement in reversed(edits):
        out = out[:start] + replacement + out[end:]
    return out, renamed


def _bare_values(code: str, start: int, end: int, *, top: bool, depth: int
                 ) -> list[tuple[int, int, str]]:
    """Edits quoting the bare words of the value ``code[start:end]``: the value itself, or
    the items of a list (lists in lists too, down to :data:`MAX_LIST_DEPTH`). Anything else is
    left to ClassAd."""
    text = code[start:end]
    first = start + len(text) - len(text.lstrip())
    last = start + len(text.rstrip())
    if first >= last:
        return []
    value = code[first:last]
    if value.startswith("{") and value.endswith("}"):
        items = _list_items(code, first + 1, last - 1) if depth < MAX_LIST_DEPTH else None
        if items is None:
            return []
        return [edit for a, b in items
                for edit in _bare_values(code, a, b, top=False, depth=depth + 1)]
    if _is_bare(value, top=top):
        return [(first, last, '"' + value + '"')]
    return []


def _list_items(code: str, start: int, end: int) -> list[tuple[int, int]] | None:
    """The spans of a list's items (split at its own commas), or None when the list holds
    anything but strings, words and lists (a section, a call: left to ClassAd)."""
    items: list[tuple[int, int]] = []
    depth = 0
    begin = start
    for i in range(start, end):
        c = code[i]
        if c in "[(":
            if not _placeholder_at(code, i):
                return None
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            items.append((begin, i))
            begin = i + 1
    items.append((begin, end))
    return items


def _placeholder_at(code: str, i: int) -> bool:
    return code[i] == "(" and re.match(r"%\(\w+\)s", code[i - 1:]) is not None


def _is_bare(value: str, *, top: bool) -> bool:
    """Whether a value (or a list item) is a word or file name DIRAC reads as its text. At
    the top level, words separated by commas are one text too (a list to DIRAC)."""
    words = [w.strip() for w in value.split(",")] if top else [value]
    if any(not w or not _BARE.fullmatch(w) for w in words):
        return False
    if len(words) == 1:
        word = words[0]
        if word.lower() in _KEYWORDS or _NUMBER.fullmatch(word):
            return False
        if _ARITHMETIC.fullmatch(word) and any(c.isdigit() for c in word):
            return False  # 7200/2, 1e5: ClassAd's arithmetic
    return True
