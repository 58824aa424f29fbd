"""The JSON form describes the same jobs as the JDL form.

``tests/data/json/valid-NAME.json`` is the JSON equivalent of ``tests/data/jdl/valid-NAME.jdl``
(memory in bytes, duration in seconds, processors as process_count times
cpu_cores_per_process, JDL-only and unknown fields in attributes.custom_attributes);
``invalid-NAME.json`` must be refused with exactly the message in ``invalid-NAME.error``.

Parser bugs found so far are fixed; each keeps a test below that shows the refusal it now
gives. A new bug is shown by a ``test_bug_*`` test marked ``xfail(strict=True)`` until fixed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optimizers.description import JobDescription, JobDescriptionError
from optimizers.jdl import parse_jdl
from optimizers.jobjson import parse_json_bulk, parse_json_text
from tests.helpers import refusal as assert_refused

DATA = Path(__file__).resolve().parents[1] / "data"
JSON_DIR = DATA / "json"
JDL_DIR = DATA / "jdl"
VALID = sorted(JSON_DIR.glob("valid-*.json"))
INVALID = sorted(JSON_DIR.glob("invalid-*.json"))
MB = 1024 * 1024


def refusal(text: str) -> JobDescriptionError:
    """The error parse_json_text raises for ``text``: exactly a JobDescriptionError."""
    return assert_refused(parse_json_text, text)


def test_there_are_enough_cases() -> None:
    assert len(VALID) >= 8
    assert len(INVALID) >= 8


def test_every_file_has_its_counterpart() -> None:
    for path in VALID:
        assert (JDL_DIR / f"{path.stem}.jdl").is_file(), f"no JDL for {path.name}"
    for path in INVALID:
        assert path.with_suffix(".error").is_file(), path.name
    for path in JSON_DIR.iterdir():
        assert path.suffix in {".json", ".error"}, f"unexpected file {path.name}"
        assert path.name.startswith(("valid-", "invalid-")), path.name
        if path.suffix == ".error":
            assert path.with_suffix(".json").is_file(), path.name


@pytest.mark.parametrize("path", VALID, ids=[p.name for p in VALID])
def test_json_equals_jdl(path: Path) -> None:
    from_json = parse_json_text(path.read_text(encoding="utf-8"))
    from_jdl = parse_jdl((JDL_DIR / f"{path.stem}.jdl").read_text(encoding="utf-8"))
    assert all(isinstance(job, JobDescription) for job in from_json)
    assert from_json == from_jdl


@pytest.mark.parametrize("path", INVALID, ids=[p.name for p in INVALID])
def test_invalid_json(path: Path) -> None:
    error = refusal(path.read_text(encoding="utf-8"))
    expected = path.with_suffix(".error").read_text(encoding="utf-8").removesuffix("\n")
    assert str(error) == expected


# -- the unit conversions, spelled out --------------------------------------------------------


@pytest.mark.parametrize(("memory", "mb"), [(0, 0), (1, 1), (MB, 1), (MB + 1, 2),
                                            (4000 * MB, 4000), (2.5 * MB, 3)])
def test_memory_bytes_round_up_to_mb(memory: float, mb: int) -> None:
    (job,) = parse_json_text(f'{{"executable": "a", "resources": {{"memory": {memory}}}}}')
    assert job.memory == mb


def test_processors_are_processes_times_cores() -> None:
    (job,) = parse_json_text(
        '{"executable": "a", "resources": {"process_count": 3, "cpu_cores_per_process": 4}}')
    assert (job.processors, job.max_processors) == (12, 12)


def test_a_list_of_jobs_concatenates_them() -> None:
    jobs = parse_json_text('[{"executable": "a"}, {"executable": "b", "attributes": '
                           '{"custom_attributes": {"Parameters": 2}}}]')
    # DIRAC's sequence: ParameterStart 1 and ParameterStep 0 unless given (parametric.py).
    assert [(j.executable, j.parameter) for j in jobs] == [("a", None), ("b", "1"), ("b", "1")]


def test_oversize_json() -> None:
    text = '{"executable": "a", "name": "' + "x" * 70_000 + '"}'
    assert str(refusal(text)) == (
        "the JSON description is 70031 bytes long; at most 65536 are accepted")


# -- refusals that once slipped through (each was a test_bug_* expected failure) --------------


def test_deeply_nested_json_is_refused() -> None:
    # json.loads raised RecursionError on nesting well under 64 KB.
    assert str(refusal("[" * 30_000 + "]" * 30_000)) == (
        "the JSON description is nested too deeply: at most 32 levels of objects and lists "
        "are accepted")


def test_empty_list_is_refused() -> None:
    # It used to give no jobs at all.
    assert str(refusal("[]")) == "the JSON description is an empty list: it holds no job"


@pytest.mark.parametrize(("text", "message"), [
    ('{"executable": "a", "attributes": {"custom_attributes": {"CPUTime": 7200}, '
     '"duration": 3600}}',
     "attributes.duration repeats attributes.custom_attributes.CPUTime; give it once"),
    ('{"executable": "a", "attributes": {"duration": 3600, "custom_attributes": '
     '{"CPUTime": 7200}}}',
     "attributes.custom_attributes.CPUTime repeats attributes.duration; give it once"),
    ('{"attributes": {"custom_attributes": {"Executable": "b"}}, "executable": "a"}',
     "executable repeats attributes.custom_attributes.Executable; give it once"),
    ('{"executable": "a", "attributes": {"custom_attributes": {"EXECUTABLE": "b"}}}',
     "attributes.custom_attributes.EXECUTABLE repeats executable; give it once"),
    ('{"executable": "a", "attributes": {"custom_attributes": {"NumberOfProcessors": 2}}, '
     '"resources": {"process_count": 2}}',
     "resources.process_count repeats attributes.custom_attributes.NumberOfProcessors; "
     "give it once"),
    ('{"executable": "a", "attributes": {"custom_attributes": {"MaxRAM": 2}}, '
     '"resources": {"memory": 2097152}}',
     "resources.memory repeats attributes.custom_attributes.MaxRAM; give it once"),
    ('{"executable": "a", "attributes": {"custom_attributes": {"Tag": "x", "Tags": "y"}}}',
     "attributes.custom_attributes.Tags repeats attributes.custom_attributes.Tag; give it once"),
    ('{"executable": "a", "attributes": {"queue_name": "x", "custom_attributes": '
     '{"queue_name": "y"}}}',
     "attributes.custom_attributes.queue_name repeats attributes.queue_name; give it once"),
    ('{"executable": "a", "executable": "b"}', "executable is given twice; give it once"),
    ('{"executable": "a", "attributes": {"custom_attributes": {"X": 1, "X": 2}}}',
     "attributes.custom_attributes.X is given twice; give it once"),
])
def test_repeated_field_is_refused_in_any_order(text: str, message: str) -> None:
    # Repeats used to be caught only when custom_attributes came second.
    assert str(refusal(text)) == message


def test_requirements_expression_is_checked() -> None:
    # A string Requirements used to be stored unparsed: syntax errors went undetected.
    assert str(refusal('{"executable": "a", "attributes": '
                       '{"custom_attributes": {"Requirements": "other.Memory >"}}}')) == (
        "attributes.custom_attributes.Requirements is not a valid ClassAd expression: "
        "other.Memory >")


def test_unused_resource_fields_are_checked() -> None:
    # node_count, processes_per_node, gpu_cores_per_process and exclusive_node_use used to be
    # accepted without being checked or used.
    assert str(refusal('{"executable": "a", "resources": {"gpu_cores_per_process": "two"}}')) == (
        'resources.gpu_cores_per_process must be a non-negative integer, got "two"')


@pytest.mark.parametrize(("text", "message"), [
    ('{"executable": "run\\ud800.sh"}',
     "executable contains a character that is not valid Unicode (a lone surrogate)"),
    ('{"executable": "a", "arguments": ["x", "\\udfff"]}',
     "arguments contains a character that is not valid Unicode (a lone surrogate)"),
    ('{"executable": "a", "\\ud800": 1}',
     "a key of the job description contains a character that is not valid Unicode "
     "(a lone surrogate)"),
    ('{"executable": "a", "environment": {"A\\udc00": "1"}}',
     "a key in environment contains a character that is not valid Unicode (a lone surrogate)"),
])
def test_lone_surrogate_is_refused(text: str, message: str) -> None:
    # It used to be accepted, as a string that cannot be encoded as UTF-8.
    assert str(refusal(text)) == message


def test_integer_too_long_for_python_is_refused() -> None:
    text = '{"executable": "a", "attributes": {"custom_attributes": {"Priority": -' + (
        "1" * 5000) + "}}}"
    assert str(refusal(text)) == (
        "the JSON description holds an integer of 5000 digits; at most 4300 digits are accepted")


# -- messages in JSON's words -----------------------------------------------------------------


@pytest.mark.parametrize(("text", "kind"), [
    ("42", "a number"), ("4.5", "a number"), ('"x"', "a string"), ("true", "true"),
    ("false", "false"), ("null", "null"),
])
def test_a_job_that_is_not_an_object_is_named_in_json_terms(text: str, kind: str) -> None:
    assert str(refusal(text)) == f"a JSON job description must be an object, got {kind}"
    assert str(refusal(f'[{{"executable": "a"}}, {text}]')) == (
        f"job 1: a JSON job description must be an object, got {kind}")


def test_missing_executable_is_named_by_its_json_key() -> None:
    error = refusal('{"arguments": ["-v"]}')
    assert str(error) == "executable is required: the program the job runs"
    assert error.field == "executable"


# -- Requirements -------------------------------------------------------------------------


def with_requirements(value: str) -> str:
    """A job whose custom_attributes.Requirements is ``value`` (JSON text)."""
    return ('{"executable": "a", "attributes": {"custom_attributes": {"Requirements": '
            + value + "}}}")


def test_requirements_expression_is_stored_as_the_jdl_parser_stores_it() -> None:
    (job,) = parse_json_text('{"executable": "a", "attributes": {"custom_attributes": '
                             '{"Requirements": "member( \\"GPU\\" , other.Tags )"}}}')
    (from_jdl,) = parse_jdl('Executable = "a"; Requirements = member("GPU", other.Tags);')
    assert job.requirements_expression == 'member("GPU",other.Tags)'
    assert job == from_jdl


@pytest.mark.parametrize("value", ["true", '"true"', '"TRUE"', "{}"])
def test_requirements_true_means_no_requirement(value: str) -> None:
    (job,) = parse_json_text(with_requirements(value))
    assert (job.requirements, job.requirements_expression) == (None, None)


@pytest.mark.parametrize(("value", "message"), [
    ("false", "is false: no resource could ever run this job"),
    ('"false"', "is false: no resource could ever run this job"),
    ("7", "must be an object of resource requirements or a string holding a ClassAd "
          "expression, got 7"),
    ('["a"]', "must be an object of resource requirements or a string holding a ClassAd "
              'expression, got ["a"]'),
])
def test_requirements_that_cannot_be_used_are_refused(value: str, message: str) -> None:
    assert str(refusal(with_requirements(value))) == (
        f"attributes.custom_attributes.Requirements {message}")


def test_long_invalid_requirements_are_shortened_in_the_message() -> None:
    expression = "other.Memory > " + "1 + " * 100
    text = ('{"executable": "a", "attributes": {"custom_attributes": {"Requirements": "'
            + expression + '"}}}')
    assert str(refusal(text)) == (
        "attributes.custom_attributes.Requirements is not a valid ClassAd expression: "
        + expression[:77] + "...")


# -- the other PSI/J resources ----------------------------------------------------------------


def test_processes_per_node_counts_the_processes_on_the_one_node() -> None:
    (job,) = parse_json_text('{"executable": "a", "resources": {"node_count": 1, '
                             '"processes_per_node": 3, "cpu_cores_per_process": 2}}')
    assert (job.processors, job.max_processors) == (6, 6)
    (job,) = parse_json_text('{"executable": "a", "resources": {"process_count": 3, '
                             '"processes_per_node": 3}}')
    assert job.processors == 3


@pytest.mark.parametrize(("resources", "message"), [
    ('{"node_count": 2}', "multi-node jobs are not supported: resources.node_count must be 1, "
                          "got 2; ask for processes on one node with resources.process_count"),
    ('{"node_count": 0}', "resources.node_count must be a positive integer, got 0"),
    ('{"processes_per_node": true}',
     "resources.processes_per_node must be a positive integer, got true"),
    ('{"process_count": 4, "processes_per_node": 2}',
     "multi-node jobs are not supported: resources.process_count (4) with "
     "resources.processes_per_node (2) needs more than one node"),
    ('{"process_count": 2, "processes_per_node": 4}',
     "resources.processes_per_node (4) cannot be more than resources.process_count (2): "
     "jobs run on one node"),
    ('{"gpu_cores_per_process": -1}',
     "resources.gpu_cores_per_process must be a non-negative integer, got -1"),
    ('{"gpu_cores_per_process": 1.5}',
     "resources.gpu_cores_per_process must be a non-negative integer, got 1.5"),
    ('{"exclusive_node_use": 1}', "resources.exclusive_node_use must be true or false, got 1"),
])
def test_bad_resource_fields_are_refused(resources: str, message: str) -> None:
    assert str(refusal(f'{{"executable": "a", "resources": {resources}}}')) == message


@pytest.mark.parametrize(("resources", "gpus"), [
    ('{"gpu_cores_per_process": 2}', 2),
    ('{"process_count": 3, "gpu_cores_per_process": 1}', 3),
    ('{"gpu_cores_per_process": 0}', 0),
])
def test_gpu_cores_are_the_jobs_gpus(resources: str, gpus: int) -> None:
    """PSI/J's GPU cores per process, times the processes: the job's NumberOfGPUs, as the
    JDL gives it; no tag is added and nothing is left in the extra fields."""
    (job,) = parse_json_text(f'{{"executable": "a", "resources": {resources}}}')
    assert (job.gpus, job.tags, job.extra) == (gpus, frozenset(), {})
    (same,) = parse_json_text('{"executable": "a", "attributes": {"custom_attributes": '
                              f'{{"NumberOfGPUs": {gpus}}}}}}}')
    assert same.gpus == gpus


def test_gpus_given_twice_are_refused() -> None:
    assert str(refusal('{"executable": "a", "resources": {"gpu_cores_per_process": 1}, '
                       '"attributes": {"custom_attributes": {"NumberOfGPUs": 1}}}')) == (
        "attributes.custom_attributes.NumberOfGPUs repeats resources.gpu_cores_per_process; "
        "give it once")


def test_no_gpu_cores_add_no_tag_and_exclusive_node_use_is_kept() -> None:
    (job,) = parse_json_text('{"executable": "a", "resources": {"gpu_cores_per_process": 0, '
                             '"exclusive_node_use": true, "node_count": 1}}')
    assert job.tags == frozenset()
    assert job.extra == {"exclusive_node_use": True}


def test_huge_memory_is_refused_without_overflow() -> None:
    """Rounded to MB without a float overflow, then refused: no column holds it."""
    error = refusal('{"executable": "a", "resources": {"memory": 1' + "0" * 400 + "}}")
    assert "resources.memory must be a non-negative integer number of MB of at most" in str(
        error)
    (job,) = parse_json_text('{"executable": "a", "resources": {"memory": 1073741824}}')
    assert job.memory == 1024


def test_a_list_of_jobs_may_hold_at_most_the_parametric_limit() -> None:
    job = '{"executable": "a", "attributes": {"custom_attributes": {"Parameters": 5000}}}'
    assert len(parse_json_text(f"[{job}, {job}]")) == 10_000
    assert str(refusal(f"[{job}, {job}, {{\"executable\": \"b\"}}]")) == (
        "the JSON description holds more than 10000 jobs (counting each parameter of a "
        "parametric job); at most 10000 jobs can be submitted at once")


@pytest.mark.parametrize("expression", [
    'other.Site == "X" || other.Foo is undefined',
    'other.Site == "X" || isUndefined(other.Foo)',
    'other.Site =?= undefined',
    'other.Foo isnt undefined && other.Site == "X"',
    'TARGET.Site is undefined',
])
def test_requirements_reading_the_resource_are_kept_not_folded(expression: str) -> None:
    # Evaluated with no resource, other.* is undefined: these used to fold to true (stored
    # as no requirement at all) or false (refused as never matching).
    (job,) = parse_jdl(f'Executable = "a"; Requirements = {expression};')
    assert job.requirements is None
    assert job.requirements_expression is not None
    assert "Site" in job.requirements_expression or "Foo" in job.requirements_expression
    (from_json,) = parse_json_text(with_requirements(json.dumps(expression)))
    assert from_json.requirements_expression == job.requirements_expression


# -- a bulk's strings are checked unless the text cannot hold what the checks look for ---------


@pytest.mark.parametrize(("item", "message"), [
    ('{"executable": "a", "arguments": ["\\ud800"]}',
     "job 2: arguments contains a character that is not valid Unicode (a lone surrogate)"),
    ('{"executable": "a", "environment": {"A": "x\\u0000y"}}',
     "job 2: environment.A contains a NUL character"),
    ('{"executable": "a", "\\udfff": 1}',
     "job 2: a key of the job description contains a character that is not valid Unicode "
     "(a lone surrogate)"),
])
def test_a_bad_string_late_in_a_bulk_is_refused(item: str, message: str) -> None:
    """Plain jobs first, an escape only in the third: the bulk's strings are still checked."""
    text = f'[{{"executable": "a"}}, {{"executable": "é", "name": "漢"}}, {item}]'
    assert str(refusal(text)) == message


def test_a_text_holding_a_surrogate_itself_is_refused_without_an_escape() -> None:
    text = '[{"executable": "a"}, {"executable": "b\ud800"}]'
    assert str(refusal(text)) == (
        "job 1: executable contains a character that is not valid Unicode (a lone surrogate)")


def test_nesting_and_repeats_are_refused_in_a_bulk_of_plain_texts() -> None:
    deep = '{"x": ' * 40 + "1" + "}" * 40
    text = ('[{"executable": "a"}, {"executable": "b", "attributes": {"custom_attributes": '
            f'{{"Deep": {deep}}}}}}}]')
    assert "nested too deeply" in str(refusal(text))
    assert str(refusal('[{"executable": "a"}, {"executable": "b", "executable": "c"}]')) == (
        "job 1: executable is given twice; give it once")


def test_each_job_of_a_bulk_keeps_its_own_compact_text() -> None:
    """Each object of a list is stored as the compact JSON the standard library writes (the
    same characters, escapes and order), and reads back as the object it was."""
    items = [{"executable": "/bin/echo", "arguments": ['say "hi"', "back\\slash", "tab\t",
                                                      "é漢字🚀", "a\u2028b"],
              "environment": {"Z": "1", "A": "2"}},
             {"executable": "b", "attributes": {"custom_attributes": {
                 "Priority": 3, "Huge": 10 ** 30, "Ratio": 0.1, "Flag": True, "None": None}}}]
    expected = [json.dumps(i, ensure_ascii=False, separators=(",", ":")) for i in items]
    # Escaped (its strings checked) and raw (\u-free: its strings not checked again).
    for text in (json.dumps(items), json.dumps(items, ensure_ascii=False)):
        stored = [own for own, _jobs in parse_json_bulk(text)]
        assert stored == expected
        assert [json.loads(own) for own in stored] == items
