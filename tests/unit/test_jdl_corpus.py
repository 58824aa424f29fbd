"""A corpus of JDL files, valid and invalid, read by parse_jdl.

``tests/data/jdl/valid-NAME.jdl`` must parse into the jobs in ``valid-NAME.expected.json`` (the
jobs as plain JSON: see :func:`jobs_as_json`); ``invalid-NAME.jdl`` must be refused with a
:class:`JobDescriptionError` whose message is exactly the text of ``invalid-NAME.error``.
Inputs that cannot sensibly be committed (64 KB, NUL bytes) are generated here.

The ``test_regression_*`` tests at the end pin bugs found in the parser and fixed: a crash on a
self-reference, text dropped after a stray ']', integers read as 0, unbounded expansion, ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from optimizers.description import (
    MAX_DESCRIPTION_BYTES,
    MAX_PARAMETRIC_JOBS,
    JobDescription,
    JobDescriptionError,
)
from optimizers.jdl import parse_jdl
from tests.helpers import refusal as assert_refused

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "jdl"
VALID = sorted(DATA.glob("valid-*.jdl"))
INVALID = sorted(DATA.glob("invalid-*.jdl"))


def as_plain(value: Any) -> Any:
    """``value`` as JSON data: frozensets become sorted lists, tuples lists, mappings dicts."""
    if isinstance(value, frozenset | set):
        return sorted(as_plain(v) for v in value)
    if isinstance(value, list | tuple):
        return [as_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: as_plain(v) for k, v in value.items()}
    return value


def jobs_as_json(jobs: list[JobDescription]) -> list[dict[str, Any]]:
    """Parsed jobs as the JSON the ``.expected.json`` files hold."""
    return [as_plain(dataclasses.asdict(job)) for job in jobs]


def read_error(path: Path) -> str:
    """The expected message of ``invalid-NAME.jdl``: its ``.error`` file, less the final newline."""
    return path.with_suffix(".error").read_text(encoding="utf-8").removesuffix("\n")


def refusal(text: str) -> JobDescriptionError:
    """The error parse_jdl raises for ``text``: exactly a JobDescriptionError."""
    return assert_refused(parse_jdl, text)


# -- the corpus -------------------------------------------------------------------------------


def test_the_corpus_is_large_enough() -> None:
    assert len(VALID) >= 15
    assert len(INVALID) >= 30


def test_every_file_has_its_expectation_and_nothing_is_left_over() -> None:
    for path in VALID:
        assert path.with_name(path.name[: -len(".jdl")] + ".expected.json").is_file(), path.name
    for path in INVALID:
        assert path.with_suffix(".error").is_file(), path.name
    for path in DATA.iterdir():
        if path.name.endswith(".expected.json"):
            assert path.with_name(path.name[: -len(".expected.json")] + ".jdl").is_file()
        elif path.suffix == ".error":
            assert path.with_suffix(".jdl").is_file(), path.name
        else:
            assert path.suffix == ".jdl", f"unexpected file {path.name}"
            assert path.name.startswith(("valid-", "invalid-")), path.name


@pytest.mark.parametrize("path", VALID, ids=[p.name for p in VALID])
def test_valid_jdl(path: Path) -> None:
    jobs = parse_jdl(path.read_text(encoding="utf-8"))
    assert jobs
    assert all(isinstance(job, JobDescription) for job in jobs)
    expected_file = path.with_name(path.name[: -len(".jdl")] + ".expected.json")
    expected = json.loads(expected_file.read_text(encoding="utf-8"))
    assert jobs_as_json(jobs) == expected


@pytest.mark.parametrize("path", INVALID, ids=[p.name for p in INVALID])
def test_invalid_jdl(path: Path) -> None:
    error = refusal(path.read_text(encoding="utf-8"))
    assert str(error) == read_error(path)


# -- a few meanings spelled out, so a regenerated expectation cannot silently go wrong ---------


def _one(name: str) -> JobDescription:
    (job,) = parse_jdl((DATA / name).read_text(encoding="utf-8"))
    return job


def test_dirac_job_without_brackets_and_site_any() -> None:
    job = _one("valid-dirac-no-brackets.jdl")
    assert job.sites == frozenset()  # "ANY": no restriction
    assert job.banned_sites == {"LCG.Bad.org", "LCG.Broken.net"}
    assert job.job_type == "MCSimulation" and job.priority == 0
    assert job.extra == {"OwnerGroup": "lhcb_mc"}


def test_parametric_range_expands_start_step() -> None:
    jobs = parse_jdl((DATA / "valid-parametric-range.jdl").read_text(encoding="utf-8"))
    assert [j.parameter for j in jobs] == ["10", "12", "14", "16", "18"]
    assert [j.arguments for j in jobs] == [("--seed", p) for p in ("10", "12", "14", "16", "18")]
    assert [j.stdout for j in jobs] == [f"job_{i}.out" for i in range(5)]


def test_parametric_list_substitutes_everywhere() -> None:
    jobs = parse_jdl((DATA / "valid-parametric-list.jdl").read_text(encoding="utf-8"))
    assert [j.parameter for j in jobs] == ["run1.dat", "run2.dat", "42"]
    assert jobs[2].input_sandbox == ("42", "process.sh")
    assert jobs[1].environment == {"PARAM": "run2.dat"}
    assert jobs[1].job_name == "scan_1"


def test_requirements_section_and_expression() -> None:
    section = _one("valid-requirements-section.jdl")
    assert section.requirements == {
        "MaxRAM": 4000, "Platform": "x86_64-el9",
        "SoftwareTag": ["VO-lhcb-Gaudi-v38", "VO-lhcb-ROOT-6.30"]}
    assert section.memory == 0  # MaxRAM inside the section is a pool requirement only
    glite = _one("valid-requirements-glite.jdl")
    assert glite.requirements is None
    assert glite.requirements_expression == 'other.Memory > 2000 && member("GPU",other.Tags)'
    assert glite.extra == {"Rank": "other.FreeCPUs"}


def test_arithmetic_is_evaluated() -> None:
    job = _one("valid-arithmetic.jdl")
    assert (job.cpu_time, job.memory, job.priority, job.processors) == (10800, 4096, 3, 4)


# -- generated invalid inputs -----------------------------------------------------------------


def _padded(size: int) -> str:
    """A valid JDL of exactly ``size`` bytes of UTF-8."""
    head = 'Executable = "run.sh"; Padding = "'
    tail = '";'
    return head + "x" * (size - len(head) - len(tail)) + tail


def test_a_jdl_of_exactly_the_maximum_size_is_accepted() -> None:
    text = _padded(MAX_DESCRIPTION_BYTES)
    assert len(text.encode("utf-8")) == MAX_DESCRIPTION_BYTES
    (job,) = parse_jdl(text)
    assert job.executable == "run.sh"


def test_oversize_jdl() -> None:
    error = refusal(_padded(MAX_DESCRIPTION_BYTES + 1))
    assert str(error) == "the JDL is 65537 bytes long; at most 65536 are accepted"


def test_oversize_counts_bytes_not_characters() -> None:
    text = 'Executable = "run.sh"; JobName = "' + "é" * 40_000 + '";'
    error = refusal(text)
    assert str(error) == "the JDL is 80036 bytes long; at most 65536 are accepted"


def test_nul_byte() -> None:
    error = refusal('[ Executable = "run\x00.sh"; ]')
    assert str(error) == "the JDL contains a NUL character"


def test_too_many_parameter_values() -> None:
    values = ", ".join("1" for _ in range(MAX_PARAMETRIC_JOBS + 1))
    error = refusal(f'Executable = "run.sh"; Parameters = {{{values}}};')
    assert str(error) == (
        "Parameters lists 10001 values; at most 10000 jobs can be submitted at once")


def test_not_text() -> None:
    error = refusal(b'Executable = "run.sh";')  # type: ignore[arg-type]
    assert str(error) == "a JDL must be text, got bytes"


# -- parser bugs: each test states the right behaviour and fails until the bug is fixed --------


def _in_subprocess(text: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """parse_jdl(text) in a child process (the input may crash the interpreter)."""
    script = textwrap.dedent("""
        import sys
        from optimizers.description import JobDescriptionError
        from optimizers.jdl import parse_jdl
        try:
            parse_jdl(sys.stdin.read())
        except JobDescriptionError as exc:
            print("JobDescriptionError:", exc)
        else:
            print("parsed")
    """)
    return subprocess.run([sys.executable, "-c", script], input=text, capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout, check=False)


def test_regression_self_reference_crashes_the_interpreter() -> None:
    # A user forgetting the quotes around the ROOT software tag.
    result = _in_subprocess('[ Executable = "run.sh"; Requirements = [ SoftwareTag = ROOT; ]; ]')
    assert result.returncode == 0, f"the parser killed the process (signal {-result.returncode})"
    assert result.stdout.startswith("JobDescriptionError:")


def test_regression_long_requirements_expression_raises_classad_exception() -> None:
    sites = " || ".join(f'other.Site == "LCG.S{i}.org"' for i in range(500))
    text = f'Executable = "run.sh"; Requirements = {sites};'
    assert len(text.encode("utf-8")) < MAX_DESCRIPTION_BYTES
    with contextlib.suppress(JobDescriptionError):  # refusing it with a message is fine too
        parse_jdl(text)


def test_regression_parametric_expansion_is_unbounded() -> None:
    text = 'Executable = "run.sh"; Parameters = 10000; Arguments = "' + "%s " * 20_000 + '";'
    assert len(text.encode("utf-8")) < MAX_DESCRIPTION_BYTES
    try:
        result = _in_subprocess(text, timeout=5)
    except subprocess.TimeoutExpired:
        pytest.fail("parse_jdl was still expanding the jobs after 5 s")
    assert result.stdout.startswith("JobDescriptionError:")


def test_regression_lone_surrogate_raises_unicode_error() -> None:
    with pytest.raises(JobDescriptionError):
        parse_jdl('Executable = "run\ud800.sh";')


def test_regression_huge_parameter_factor_raises_value_error() -> None:
    text = ('Executable = "run.sh"; Parameters = 2000; ParameterStart = 2; '
            "ParameterFactor = 1000000000;")
    with contextlib.suppress(JobDescriptionError):
        parse_jdl(text)


def test_regression_attributes_after_a_stray_bracket_are_dropped() -> None:
    refusal('[\n    Executable = "run.sh";\n];\nCPUTime = 60;\n')


def test_regression_comment_after_the_closing_bracket_is_refused() -> None:
    (job,) = parse_jdl('[\n    Executable = "run.sh";\n]\n// end of the job description\n')
    assert job.executable == "run.sh"


def test_regression_text_after_the_ad_is_reported_as_an_unclosed_bracket() -> None:
    error = refusal('[ Executable = "run.sh"; ] junk')
    assert "never closed" not in str(error)


def test_regression_syntax_error_line_after_a_comment_line() -> None:
    text = '[\n    Executable = "run.sh";\n    // the next line is wrong\n    CPUTime = = 5;\n]\n'
    message = str(refusal(text))
    assert "at line 4:" in message
    assert '"CPUTime = = 5"' in message


def test_regression_error_value_reported_as_undefined_attribute() -> None:
    message = str(refusal('Executable = "run.sh"; CPUTime = 3600 / 0;'))
    assert "not defined" not in message


def test_regression_same_field_twice_takes_the_last_value() -> None:
    refusal('Executable = "run.sh";\nexecutable = "rm.sh";')


def test_regression_integer_overflow_becomes_zero() -> None:
    refusal('Executable = "run.sh"; MaxRAM = 9223372036854775808;')


def test_regression_processor_limit_not_in_the_message() -> None:
    message = str(refusal('Executable = "run.sh"; NumberOfProcessors = 5000;'))
    assert "4096" in message


def test_regression_quoted_requirements_expression_is_accepted() -> None:
    refusal('Executable = "run.sh"; Requirements = "other.Memory > 2000";')


def test_regression_float_parameter_steps_accumulate_rounding_errors() -> None:
    jobs = parse_jdl('Executable = "run.sh"; Arguments = "%s"; Parameters = 3; '
                     "ParameterStart = 0.1; ParameterStep = 0.1;")
    assert [j.parameter for j in jobs] == ["0.1", "0.2", "0.3"]


def test_regression_list_items_are_not_evaluated() -> None:
    jobs = parse_jdl('Executable = "run.sh"; Arguments = "%s"; Parameters = {2 * 3, 4};')
    assert [j.parameter for j in jobs] == ["6", "4"]


def test_regression_deep_bare_word_lists_overflow_the_stack() -> None:
    # Lists in lists far deeper than a description needs: read or refused, never a
    # RecursionError (the bare words below the 16th level are left to ClassAd).
    with contextlib.suppress(JobDescriptionError):
        parse_jdl('Executable = "x"; A = ' + "{" * 20 + "a" + "}" * 20 + ";")
    refusal('Executable = "x"; A = ' + "{" * 5000 + "a" + "}" * 5000 + ";")


@pytest.mark.parametrize(("text", "gpus"), [
    ('Executable = "a";', 0), ('Executable = "a"; NumberOfGPUs = 2;', 2),
    ('Executable = "a"; numberofgpus = 64;', 64)])
def test_number_of_gpus_is_the_jobs_gpus(text: str, gpus: int) -> None:
    (job,) = parse_jdl(text)
    assert job.gpus == gpus


@pytest.mark.parametrize("value", ["-1", "65", '"two"', "1.5"])
def test_a_bad_number_of_gpus_is_refused(value: str) -> None:
    message = str(refusal(f'Executable = "a"; NumberOfGPUs = {value};'))
    assert "NumberOfGPUs" in message and "an integer from 0 to 64" in message, message
