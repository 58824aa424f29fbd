from __future__ import annotations

from typing import Any

import pytest

from taskqueue.core.errors import InvalidResourceError
from taskqueue.core.resources import parse_resource


def test_a_single_string_equals_a_one_element_list() -> None:
    assert parse_resource({"vo": "lhcb", "site": "A"}).site == frozenset({"A"})
    assert parse_resource({"vo": "lhcb", "site": ["A"]}).site == frozenset({"A"})


@pytest.mark.parametrize("value", [None, [], ""])
def test_absent_or_empty_sets_no_condition(value: Any) -> None:
    data: dict[str, Any] = {"vo": "lhcb"}
    if value is not None:
        data["platform"] = value
    assert parse_resource(data).platform is None  # "" too: an empty string is not given


def test_no_tags_means_only_untagged_queues() -> None:
    assert parse_resource({"vo": "lhcb"}).tags == frozenset()
    assert parse_resource({"vo": "lhcb", "tags": []}).tags == frozenset()


@pytest.mark.parametrize("value", ["ANY", "any", "Any", ["x", "aNy"]])
def test_any_switches_the_check_off(value: Any) -> None:
    res = parse_resource({"vo": "lhcb", "site": value, "tags": value, "platform": value})
    assert res.site is None and res.tags is None and res.platform is None


def test_required_tags_must_be_offered() -> None:
    with pytest.raises(InvalidResourceError, match="'required_tags' names GPU"):
        parse_resource({"vo": "lhcb", "tags": ["MultiProcessor"], "required_tags": "GPU"})
    res = parse_resource({"vo": "lhcb", "tags": ["GPU"], "required_tags": "GPU"})
    assert res.required_tags == frozenset({"GPU"})
    # with tags ANY, any required tag is acceptable
    assert parse_resource({"vo": "lhcb", "tags": "ANY", "required_tags": ["GPU"]}).required_tags


@pytest.mark.parametrize(("data", "message"), [
    ({}, "'vo' is required"),
    ({"vo": ""}, "'vo' is required"),
    ({"vo": 3}, "'vo' must be a string, got 3"),
    ({"vo": "x", "processors": -1}, "'processors' must be an integer from 0 to [0-9]+, got -1"),
    ({"vo": "x", "memory": "4GB"}, "'memory' must be an integer from 0 to [0-9]+, got '4GB'"),
    ({"vo": "x", "cpu_time": True}, "'cpu_time' must be an integer from 0 to [0-9]+, got True"),
    ({"vo": "x", "site": 5}, "'site' must be a string or a list of strings, got 5"),
    ({"vo": "x", "tags": ["a", 1]}, "'tags' item 1 must be a string, got 1"),
    ({"vo": "x", "required_tags": "ANY"}, "'required_tags' cannot be ANY"),
    ({"vo": "x", "tags": ["a", "b\x00c"]}, "'tags' item 1 must not hold control characters"),
    ({"vo": "x", "site": "A\nB"}, "'site' item 0 must not hold control characters"),
    ({"vo": "x\x7f"}, "'vo' must not hold control characters"),
    ({"vo": "x", "pilot_reference": "p\x00"},
     "'pilot_reference' must not hold control characters"),
])
def test_bad_descriptions_say_what_is_wrong(data: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidResourceError, match=message):
        parse_resource(data)


def test_a_non_object_is_refused() -> None:
    with pytest.raises(InvalidResourceError, match="must be a JSON object, got list"):
        parse_resource([1, 2])  # type: ignore[arg-type]


def test_unknown_fields_are_kept_for_classad_requirements() -> None:
    res = parse_resource({"vo": "lhcb", "CPUModel": "EPYC", "site": "A"})
    assert res.extra == {"CPUModel": "EPYC"}
    assert res.site_for_job == "A"
    assert parse_resource({"vo": "lhcb", "site": ["A", "B"]}).site_for_job is None


@pytest.mark.parametrize("empty", ["", "  ", [""], ["", " "]])
def test_an_empty_string_in_a_list_field_is_not_given(empty: object) -> None:
    """DIRAC pilots send ``Tag: ""`` for no tags: they get the untagged queues."""
    r = parse_resource({"vo": "x", "tags": empty, "site": empty, "platform": empty,
                        "required_tags": empty})
    assert r.tags == frozenset() and r.required_tags == frozenset()
    assert r.site is None and r.platform is None
    assert parse_resource({"vo": "x", "tags": ["", "GPU"]}).tags == frozenset({"GPU"})
