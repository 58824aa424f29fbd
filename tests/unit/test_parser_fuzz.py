"""Fuzzing the two job description parsers: whatever the input, the only exception is
JobDescriptionError, and what comes back is a list of JobDescription.

The ClassAd names ``self``, ``MY`` and ``ROOT`` are generated too: they once crashed the
interpreter (see test_jdl_corpus.test_regression_self_reference_crashes_the_interpreter).
Parametric fields get bounded values of their own so that each example stays fast.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimizers.description import KNOWN_FIELDS, JobDescription, JobDescriptionError
from optimizers.jdl import parse_jdl
from optimizers.jobjson import parse_json_text

FUZZ = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

#: Fields whose values can make a parametric expansion huge; they get values of their own.
_PARAMETRIC = {"Parameters", "ParameterFactor"}

#: Any text, lone surrogates included (refused with a message since the regression tests).
utf8_text = st.text(max_size=300)


def mostly(usual: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``usual`` four times in five, else ``other``."""
    return st.sampled_from([True] * 4 + [False]).flatmap(lambda u: usual if u else other)


def check_jdl(text: str) -> None:
    try:
        jobs = parse_jdl(text)
    except JobDescriptionError:
        return
    assert isinstance(jobs, list) and jobs
    assert all(isinstance(job, JobDescription) for job in jobs)


def check_json(text: str) -> None:
    try:
        jobs = parse_json_text(text)
    except JobDescriptionError:
        return
    assert isinstance(jobs, list)
    assert all(isinstance(job, JobDescription) for job in jobs)


# -- ClassAd-looking text ---------------------------------------------------------------------

names = st.one_of(
    st.sampled_from([f for f in KNOWN_FIELDS if f not in _PARAMETRIC]
                    + ["BannedSites", "Tag", "Origin", "LogLevel", "Rank", "other", "target",
                       "parent", "x", "A", "executable", "cputime", "self", "MY", "ROOT"]),
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True),
).filter(lambda name: name not in _PARAMETRIC)

number_text = st.one_of(
    st.integers(-50, 300).map(str),
    st.sampled_from(["0", "1", "-1", "64", "4096", "4097", "2147483648", "9223372036854775807",
                     "9223372036854775808", "99999999999999999999", "1.5", "-0.0", ".5", "1e3",
                     "2.5E-3", "1e400", "3600.0"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)

string_text = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters='"\\\x00'), max_size=12),
    st.sampled_from(["", " ", "ANY", "LCG.CERN.cern", "LCG RAL", "A=1", "=x", "1A=x", "%s",
                     "%n", "a 'b", 'x \\" y', "-c 'echo hi'", "run.sh"]),
).map(lambda s: '"' + s + '"')

scalars = st.one_of(number_text, string_text, names,
                    st.sampled_from(["true", "false", "undefined", "error", "other.Memory",
                                     "TARGET.Tags", "MY_x"]))


def _compound(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    operators = st.sampled_from(["+", "-", "*", "/", "%", "&&", "||", "==", "!=", "=?=", "=!=",
                                 "<", "<=", ">", ">=", "."])
    return st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "{" + ", ".join(items) + "}"),
        st.tuples(inner, operators, inner).map(" ".join),
        st.tuples(inner, inner, inner).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
        inner.map(lambda x: f"({x})"),
        inner.map(lambda x: f"!{x}"),
        inner.map(lambda x: f"-{x}"),
        st.tuples(st.sampled_from(["member", "size", "strcat", "int", "real", "ifThenElse",
                                   "isUndefined", "toUpper", "nosuchfunction"]),
                  st.lists(inner, max_size=3)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
        st.lists(st.tuples(names, inner), max_size=3).map(
            lambda pairs: "[ " + "; ".join(f"{n} = {v}" for n, v in pairs) + " ]"),
    )


values = st.recursive(scalars, _compound, max_leaves=12)

parametric_fields = st.one_of(
    st.tuples(st.just("Parameters"),
              st.sampled_from(["0", "1", "3", "-1", "20000", "1.5", '"x"', "{}", '{"a", 1}',
                               '{1, {2}}', "{true}", "2 + 1", "undefined", "[ A = 1 ]"])),
    st.tuples(st.just("ParameterFactor"),
              st.sampled_from(["0", "1", "2", "-1", "0.5", "1.5", '"x"', "true"])),
)
# Parametric fields in about one pair of five (they refuse most other fields otherwise).
fields = mostly(st.tuples(names, values), parametric_fields)
executables = mostly(st.sampled_from(['"run.sh"', '"/bin/sh"', '"%s.sh"']), string_text)


@st.composite
def classads(draw: st.DrawFn) -> str:
    """A mostly well-formed JDL: optional brackets, comments, Name = value; pairs."""
    pairs = draw(st.lists(fields, max_size=8))
    if draw(mostly(st.just(True), st.just(False))):
        pairs.insert(draw(st.integers(0, len(pairs))), ("Executable", draw(executables)))
    separator = draw(st.sampled_from([";\n", "; ", ";", ";\n// comment\n", "; /* c */ ", "\n"]))
    body = separator.join(f"{name} = {value}" for name, value in pairs)
    if draw(st.booleans()):
        body += ";"
    if draw(st.booleans()):
        body = f"[\n{body}\n]"
    return draw(st.sampled_from(["", "// leading comment\n", "  \n"])) + body


tokens = st.one_of(
    st.sampled_from(["[", "]", "{", "}", "(", ")", "=", "==", ";", ",", "+", "-", "*", "/", "&&",
                     "||", "!", "<", ">", "?", ":", ".", '"', "'", "\\", "//", "/*", "*/", "\n",
                     " ", "true", "false", "undefined", "error", "other.", "member", "%s", "%n",
                     "Executable", "Executable =", "Requirements =", "Parameters ="]),
    names, number_text, string_text,
)
token_soup = st.lists(tokens, max_size=60).flatmap(
    lambda items: st.sampled_from([" ".join(items), "".join(items)]))


@FUZZ
@given(utf8_text)
def test_parse_jdl_random_text(text: str) -> None:
    check_jdl(text)


@FUZZ
@given(token_soup)
def test_parse_jdl_token_soup(text: str) -> None:
    check_jdl(text)


@FUZZ
@given(classads())
def test_parse_jdl_classad_like(text: str) -> None:
    check_jdl(text)


# -- JSON -------------------------------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(),
                         st.floats(allow_nan=False, allow_infinity=False),
                         st.text(alphabet=st.characters(codec="utf-8"), max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.text(alphabet=st.characters(codec="utf-8"), max_size=10), inner,
                        max_size=5)),
    max_leaves=20,
)
small_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10, 5000),
              st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e12),
              st.sampled_from(["", "x", "ANY", "LCG.CERN.cern", "A=1", "bad name", "%s", "a 'b",
                               "1h", "3600", "other.Memory > 1"])),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(["A", "B", "x y", "1A"]), inner,
                                            max_size=3)),
    max_leaves=8,
)


def _maybe(key: str, strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(st.just({}), strategy.map(lambda value: {key: value}))


custom_attributes = st.dictionaries(
    st.sampled_from([f for f in KNOWN_FIELDS if f not in _PARAMETRIC]
                    + ["bannedsites", "tag", "Origin", "Rank"]),
    small_json, max_size=5,
).flatmap(lambda custom: st.tuples(
    st.just(custom),
    _maybe("Parameters", st.sampled_from([0, 1, 3, -1, 20000, 1.5, "x", [], ["a", 1], [[1]],
                                           None, True])),
    _maybe("ParameterFactor", st.sampled_from([0, 1, 2, -1, 0.5, "x", None])),
).map(lambda parts: {**parts[0], **parts[1], **parts[2]}))

resources = st.dictionaries(
    st.sampled_from(["process_count", "cpu_cores_per_process", "memory", "node_count",
                     "gpu_cores_per_process"]),
    small_json, max_size=3)
attributes = st.fixed_dictionaries({}, optional={
    "duration": small_json, "queue_name": small_json, "custom_attributes": custom_attributes,
    "account": small_json})
json_jobs = st.fixed_dictionaries({
    "executable": mostly(st.sampled_from(["run.sh", "/bin/sh", "%s"]), small_json),
}, optional={
    "arguments": small_json, "environment": small_json,
    "directory": small_json, "stdout_path": small_json, "stderr_path": small_json,
    "name": small_json, "input_sandbox": small_json, "output_sandbox": small_json,
    "resources": mostly(resources, small_json), "attributes": mostly(attributes, small_json),
    "stdin_path": small_json,
})


@FUZZ
@given(json_values)
def test_parse_json_random_values(value: Any) -> None:
    check_json(json.dumps(value))


@FUZZ
@given(st.one_of(json_jobs, st.lists(json_jobs, max_size=3)))
def test_parse_json_job_like_values(value: Any) -> None:
    check_json(json.dumps(value))


@FUZZ
@given(utf8_text)
def test_parse_json_random_text(text: str) -> None:
    check_json(text)
