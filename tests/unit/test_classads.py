"""gLite-style Requirements expressions against resources: other.X, member(), the ternary."""

from __future__ import annotations

import pytest

from optimizers.classads import canonical_expression, expression_check
from optimizers.description import JobDescriptionError
from taskqueue.core.resources import parse_resource

NODE = parse_resource({"vo": "lhcb", "site": "LCG.CERN.cern", "platform": "x86_64-el9",
                       "tags": ["GPU", "MultiProcessor"], "processors": 8, "memory": 16000,
                       "cpu_time": 86400, "CPUModel": "AMD EPYC 7543"})


@pytest.mark.parametrize(("expression", "expected"), [
    ("other.MaxRAM >= 8000", True),
    ("other.Memory > 16000", False),
    ('member("GPU", other.Tags)', True),
    ('member("FPGA", other.Tags)', False),
    ('other.Site == "LCG.CERN.cern" && other.NumberOfProcessors >= 8', True),
    ('other.Site == "LCG.RAL.uk" || other.NumberOfProcessors >= 16', False),
    ('other.NumberOfProcessors >= 8 ? other.MaxRAM >= 12000 : other.MaxRAM >= 2000', True),
    ('other.NumberOfProcessors >= 16 ? true : other.CPUTime >= 100000', False),
    ('regexp("EPYC", other.CPUModel)', True),
    ("member(\"x86_64-el9\", other.Platform)", True),
    ("other.NoSuchAttribute > 3", False),  # undefined is not a match
    ("other.MaxRAM / 0 > 1", False),  # error is not a match
    ('"text"', False),  # anything but true is not a match
])
def test_expressions_against_a_node(expression: str, expected: bool) -> None:
    assert expression_check(NODE)(canonical_expression(expression)) is expected


def test_a_long_expression_that_cannot_be_evaluated_is_no_match() -> None:
    long = " || ".join(f'other.Site == "S{i}"' for i in range(600))
    assert expression_check(NODE)(long) is False


def test_canonical_form_and_errors() -> None:
    assert canonical_expression("other.X>1&&member( \"a\" ,other.Y )") == \
        'other.X > 1 && member("a",other.Y)'
    with pytest.raises(JobDescriptionError) as refused:
        canonical_expression("other.X >")
    assert str(refused.value) == "Requirements is not a valid ClassAd expression: other.X >"
