"""StdInput, StdOutput, StdError and OutputSandbox name files in the job's folder: absolute
paths and names that lead out of it with .. are refused at submission (JDL and JSON)."""

from __future__ import annotations

import json

import pytest

from optimizers.jdl import parse_jdl
from optimizers.jobjson import parse_json_text
from tests.helpers import refusal


@pytest.mark.parametrize("field", ["StdInput", "StdOutput", "StdError", "OutputSandbox"])
@pytest.mark.parametrize(("name", "fragment"), [
    ("../../x", "leads out of it"), ("/etc/passwd", "absolute path"),
    ("out/../../x", "leads out of it"), ("..", "leads out of it"),
    ("\\\\server\\share", "absolute path"),
])
def test_names_outside_the_job_folder_are_refused(field: str, name: str, fragment: str) -> None:
    value = json.dumps(name)
    error = refusal(parse_jdl, f'[Executable = "x"; {field} = {value};]')
    assert fragment in str(error) and error.field == field
    body = {"executable": "x", "attributes": {"custom_attributes": {field: name}}}
    error = refusal(parse_json_text, json.dumps(body))
    assert fragment in str(error)


def test_parametric_names_are_checked_after_substitution() -> None:
    error = refusal(parse_jdl, '[Executable = "x"; Parameters = {"ok", ".."}; '
                               'StdOutput = "%s/std.out";]')
    assert "leads out of it" in str(error)


@pytest.mark.parametrize("name", ["std.out", "out/std.out", "a..b", ".hidden", "x/./y"])
def test_names_inside_the_job_folder_are_accepted(name: str) -> None:
    (job,) = parse_jdl(f'[Executable = "x"; StdOutput = "{name}"; OutputSandbox = {{"{name}"}};]')
    assert job.stdout == name and job.output_sandbox == (name,)


def test_standard_input_is_a_file_of_the_job_folder_in_jdl_and_json() -> None:
    (job,) = parse_jdl('[Executable = "cat"; StdInput = "in.txt"; '
                       'InputSandbox = {"in.txt"};]')
    assert job.stdin == "in.txt" and "StdInput" not in job.extra
    (job,) = parse_json_text(json.dumps({"executable": "cat", "stdin_path": "in.txt",
                                         "stdout_path": "o", "stderr_path": "e"}))
    assert (job.stdin, job.stdout, job.stderr) == ("in.txt", "o", "e")
    error = refusal(parse_json_text, json.dumps({"executable": "cat",
                                                 "stdin_path": "/home/u/in.txt"}))
    assert "absolute path" in str(error) and error.field == "stdin_path"
    error = refusal(parse_json_text, json.dumps({
        "executable": "cat", "stdin_path": "a",
        "attributes": {"custom_attributes": {"StdInput": "b"}}}))
    assert "give it once" in str(error)
