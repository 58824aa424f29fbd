"""Requirements expressions whose evaluation cost is not bounded are refused at submission,
never evaluated at match time, and verdicts are remembered per resource shape."""

from __future__ import annotations

import pytest

from optimizers import classads
from optimizers.classads import canonical_expression, expression_check
from optimizers.description import JobDescriptionError
from optimizers.expressions import (
    MAX_BOOLEAN_OPERATORS,
    MAX_EXPRESSION_BYTES,
    ExpressionError,
    analyse,
    pattern_problem,
)
from optimizers.jdl import parse_jdl
from optimizers.jobjson import parse_json_text
from taskqueue.core.resources import parse_resource
from tests.helpers import refusal

HOSTILE_TERM = 'regexp("(a|aa)+$", strcat(other.Site, "' + "a" * 28 + 'b"))'
HOSTILE = " || ".join([HOSTILE_TERM] * 40)


def jdl(requirements: str) -> str:
    return f'[ Executable = "x"; Requirements = {requirements} ]'


@pytest.mark.parametrize(("expression", "fragment"), [
    (HOSTILE, "exponential time"),
    (HOSTILE_TERM, "exponential time"),
    ('regexp("(a+)+$", other.Site)', "exponential time"),
    ('regexp("(?:ab*)*", other.Site)', "exponential time"),
    ('regexp("(a)\\\\1", other.Site)', "back-references"),
    ('regexp(other.Pattern, "x")', "not a string constant"),
    (" || ".join(['regexp("^x", other.Site)'] * 5), "regular expressions"),
    (" || ".join([f'other.Site == "S{i}"' for i in range(MAX_BOOLEAN_OPERATORS + 2)]),
     "&& and || operators"),
    (" + ".join(["size(other.Site)"] * 40) + " > 0", "functions"),
    ("foo", "refers to foo"),
    ("MY.CPUTime > 3", "refers to MY.CPUTime"),
    ("other.Site.Name == 1", "refers to other.Site.Name"),
    ('eval("x") == 1', "calls eval()"),
    ("[ a = other.X ].a > 1", "nested ClassAds"),
    ("other.Tags[0] == \"x\"", "nested ClassAds"),
    ("(" * 20 + "other.X" + ")" * 20 + " > 1", "deep"),
])
def test_costly_or_meaningless_expressions_are_refused(expression: str, fragment: str) -> None:
    for parse, text in ((parse_jdl, jdl(expression)),
                        (parse_json_text, _json(expression))):
        error = refusal(parse, text)
        assert fragment in str(error), str(error)
        assert error.field is not None and error.field.endswith("equirements")


def _json(expression: str) -> str:
    import json
    return json.dumps({"executable": "x",
                       "attributes": {"custom_attributes": {"Requirements": expression}}})


def test_an_integer_beyond_64_bits_is_refused_not_read_as_zero() -> None:
    error = refusal(parse_json_text, _json("other.X >= 10000000000000000000"))
    assert "larger than 2^63-1" in str(error)


def test_the_size_is_capped() -> None:
    long = " && ".join([f'other.Site != "{"S" * 200}{i}"' for i in range(50)])
    assert len(long) > MAX_EXPRESSION_BYTES
    with pytest.raises(ExpressionError, match="bytes long"):
        analyse(long)


@pytest.mark.parametrize("expression", [
    'regexp("^LCG\\\\.[A-Z]+\\\\.(uk|fr)$", other.Site)',
    'regexp("EPYC", other.CPUModel) && other.MaxRAM >= 2000',
    'member("GPU", other.Tags) || other.Site == "LCG.CERN.cern"',
    'other.NumberOfProcessors >= 8 ? other.MaxRAM >= 12000 : TARGET.MaxRAM >= 2000',
    'regexp("(ab)+c{2,3}[xy]*", other.Site)',
    'ifThenElse(isUndefined(other.Memory), other.MaxRAM > 1, other.Memory > 100)',
])
def test_ordinary_expressions_are_accepted(expression: str) -> None:
    (job,) = parse_jdl(jdl(expression))
    assert job.requirements_expression is not None
    canonical_expression(job.requirements_expression)


@pytest.mark.parametrize(("pattern", "refused"), [
    ("(a|aa)+$", True), ("(a*)*", True), ("((ab)*c)+", True), ("(a|b){2,}", True),
    ("(ab)+", False), ("(a|b)", False), ("[(a+)+]", False), ("a\\(b+\\)+", False),
    ("(a|b){1}", False), ("x{2}", False),
])
def test_nested_quantifiers_are_found(pattern: str, refused: bool) -> None:
    assert (pattern_problem(pattern) is not None) is refused


def test_a_stored_costly_expression_is_not_evaluated() -> None:
    """One stored before the limits existed matches nothing, and costs nothing."""
    node = parse_resource({"vo": "lhcb", "site": "aaaa"})
    assert expression_check(node)(HOSTILE) is False
    assert not any(key[0] == HOSTILE for key in classads._verdicts._items)


def test_a_verdict_is_remembered_per_values_of_the_attributes_read() -> None:
    expression = 'other.Site == "LCG.NOWHERE.xx" && other.NumberOfProcessors >= 1'
    classads._verdicts.clear()
    for cpu in (100, 200, 300):  # the CPU time differs from pilot to pilot: not read
        node = parse_resource({"vo": "lhcb", "site": "LCG.CERN.cern", "cpu_time": cpu,
                               "processors": 4})
        assert expression_check(node)(expression) is False
    kept = [key for key in classads._verdicts._items if key[0] == expression]
    assert kept == [(expression, (("numberofprocessors", 4), ("site", "LCG.CERN.cern")))]
    other_site = parse_resource({"vo": "lhcb", "site": "LCG.NOWHERE.xx", "processors": 4})
    assert expression_check(other_site)(expression) is True
    assert len([key for key in classads._verdicts._items if key[0] == expression]) == 2


def test_a_huge_pilot_attribute_is_undefined_not_an_error() -> None:
    node = parse_resource({"vo": "lhcb", "site": "S", "Disk": 10**30, "Speed": float("1e300")})
    assert expression_check(node)("other.Disk > 5") is False
    assert expression_check(node)("other.Speed > 5") is True


def test_refusal_names_the_field() -> None:
    error = refusal(parse_jdl, jdl(HOSTILE))
    assert isinstance(error, JobDescriptionError)
    assert str(error).startswith("Requirements calls regexp() with the pattern")
