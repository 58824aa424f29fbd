"""JDL attributes that refer to each other: each is evaluated once, within a budget.

The ClassAd library evaluates an attribute anew at each reference, so 60 attributes that each
use the one before twice took minutes to read (2**60 evaluations): these descriptions are read
at once now, or refused naming the attribute that goes past the budget of optimizers.jdl.
"""

from __future__ import annotations

import pytest

from matcher.pilots import Descriptions
from optimizers.description import JobDescriptionError
from optimizers.jdl import MAX_VALUE_CHARS, parse_jdl

HEAD = 'Executable = "/bin/true";\n'


def doubling(n: int, first: str, step: str, name: str = "X") -> str:
    """``X0 = first; X1 = step(X0, X0); ...``: each attribute uses the one before twice."""
    lines = [f"{name}0 = {first};"]
    lines += [f"{name}{i} = " + step.format(p=f"{name}{i - 1}") + ";" for i in range(1, n + 1)]
    return "\n".join(lines)


def refused(text: str) -> JobDescriptionError:
    with pytest.raises(JobDescriptionError) as caught:
        parse_jdl(text)
    return caught.value


def test_sixty_sums_of_the_attribute_before_are_computed() -> None:
    text = "[\n" + HEAD + doubling(60, "1", "{p} + {p}") + "\n]"
    assert len(text) < 1100
    job = parse_jdl(text)[0]
    assert job.extra["X60"] == 2**60
    assert job.extra["X1"] == 2


def test_a_known_field_built_from_sums_is_computed() -> None:
    text = "[\n" + HEAD + doubling(40, "1", "{p} + {p}") + "\nCPUTime = X40 / 2**39;\n]"
    text = text.replace("2**39", str(2**39))
    assert parse_jdl(text)[0].cpu_time == 2


def test_a_doubling_text_is_refused_naming_the_attribute_past_the_size_bound() -> None:
    text = "[\n" + HEAD + doubling(60, '"a"', "strcat({p}, {p})") + "\n]"
    error = refused(text)
    first_over = MAX_VALUE_CHARS.bit_length()  # 2**k characters > MAX_VALUE_CHARS
    assert error.field == f"X{first_over}"
    assert f"X{first_over} builds a value of {2**first_over} characters" in str(error)


def test_a_doubling_section_is_refused_naming_its_attribute() -> None:
    inner = doubling(60, '"a"', "strcat({p}, {p})", name="A").replace("\n", " ")
    error = refused("[\n" + HEAD + f"S = [ {inner} ];\nY = (S.A60);\n]")
    assert error.field is not None and error.field.startswith("S.A")
    assert "characters" in str(error)


def test_sums_in_a_requirements_section_are_computed() -> None:
    inner = doubling(60, "1", "{p} + {p}", name="T").replace("\n", " ")
    job = parse_jdl("[\n" + HEAD + f"Requirements = [ {inner} ];\n]")[0]
    assert job.requirements is not None
    assert job.requirements["T60"] == 2**60


def test_lists_of_lists_that_multiply_are_refused() -> None:
    lines = ["L0 = {1, 1, 1, 1, 1, 1, 1, 1};"]
    # In parentheses: a bare name in a list would be DIRAC's text, not a reference.
    lines += [f"L{i} = {{" + ", ".join([f"(L{i - 1})"] * 8) + "};" for i in range(1, 13)]
    error = refused("[\n" + HEAD + "\n".join(lines) + "\nArguments = (L12);\n]")
    # The total of items or the time bound stops it, at the first attribute that expands.
    assert error.field in {"Arguments"} | {f"L{i}" for i in range(13)}
    assert "characters in all" in str(error) or " ms " in str(error)


def test_attributes_in_a_cycle_are_refused_naming_the_field() -> None:
    cycle = doubling(60, "X60", "{p} + {p}")
    error = refused("[\n" + HEAD + cycle + "\nCPUTime = X60;\n]")
    assert error.field == "CPUTime"
    error = refused("[\n" + HEAD + "CPUTime = X + 1;\nX = CPUTime + 1;\n"
                    "A = (B);\nB = (A);\n]")
    assert error.field == "CPUTime"
    assert "refers to itself through other attributes (X)" in str(error)


def test_an_unknown_field_in_a_cycle_keeps_its_text() -> None:
    job = parse_jdl("[\n" + HEAD + "A = B + 1;\nB = A + 1;\nC = A;\n]")[0]
    assert job.extra["A"] == "B + 1"
    assert job.extra["C"] == "A"


def test_names_in_strings_are_no_references_and_my_is_one() -> None:
    job = parse_jdl("[\n" + HEAD + 'A = "B";\nB = strcat("A", "x");\nC = 2;\n'
                    "D = my.C * 3;\nE = (other.C);\n]")[0]
    assert job.extra["A"] == "B"
    assert job.extra["B"] == "Ax"
    assert job.extra["D"] == 6
    assert job.extra["E"] == "(other.C)"


def test_the_match_path_reads_a_stored_doubling_description_once() -> None:
    text = "[\n" + HEAD + doubling(60, "1", "{p} + {p}") + "\n]"
    cache = Descriptions(size=4)
    first = cache.get(text, "jdl", None)
    assert first.extra["X60"] == 2**60
    assert cache.get(text, "jdl", None) is first
    assert len(cache) == 1


def test_the_match_path_keeps_a_stored_text_it_cannot_read() -> None:
    # Stored before the bound existed: refused now, once, not at every match of its jobs.
    text = "[\n" + HEAD + doubling(60, '"a"', "strcat({p}, {p})") + "\n]"
    cache = Descriptions(size=4)
    with pytest.raises(JobDescriptionError) as first:
        cache.get(text, "jdl", None)
    assert first.value.field == f"X{MAX_VALUE_CHARS.bit_length()}"
    assert len(cache) == 1
    with pytest.raises(JobDescriptionError) as again:
        cache.get(text, "jdl", None)
    assert str(again.value) == str(first.value)
    assert again.value.field == first.value.field


def test_a_reference_into_a_section_nested_too_deeply_is_not_evaluated() -> None:
    section = "[ " + doubling(60, "1", "{p} + {p}", name="T").replace("\n", " ") + " ]"
    for _ in range(17):
        section = f"[ S = {section}; ]"
    path = "S" + ".S" * 17 + ".T60"
    job = parse_jdl("[\n" + HEAD + f"S = {section};\nY = ({path});\n]")[0]
    assert job.extra["Y"] == f"({path})"  # not evaluated: its text, as for any unknown

