"""The payload a match answer builds from the JSON stored with a job at submission
(optimizers.description.payload_json, table job_payloads) is byte for byte the one it built by
reading the job's description text again, for every description of the corpus (JDL, gLite JDL,
JSON, parametric and bulk), and a job stored without that JSON is still answered from its
text."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from matcher.pilots import payload
from optimizers.chain import stored_description, submissions_from_text
from optimizers.description import JobDescriptionError, payload_json
from pilot.protocol import JobPayload

DATA = Path(__file__).resolve().parents[1] / "data"
EXTRA_TEXTS = {
    "job-id-marks.jdl": (
        '[ Executable = "run-%j.sh"; Arguments = "--id %j x"; StdOutput = "out.%j"; '
        'StdError = "err"; JobName = "job %j"; InputSandbox = {"in.%j", "b"}; '
        'OutputSandbox = {"out.%j"}; Environment = {"ID=%j", "PLAIN=1"}; '
        'Site = "LCG.CERN.cern"; CPUTime = 3600; NumberOfProcessors = 2; MaxRAM = 2048; '
        'Custom = "%j"; Weight = 2.5; Flags = {1, 2}; Nested = [ a = "%j"; b = 3 ]; ]'),
    "parametric-marks.jdl": (
        '[ Executable = "run.sh"; Arguments = "%s %j"; Parameters = 3; '
        'ParameterStart = 1; ParameterStep = 2; JobName = "p%s-%j"; ]'),
    "unicode.jdl": '[ Executable = "r\u00e9sum\u00e9.sh"; Arguments = "\u2603 caf\u00e9"; ]',
}


@dataclass
class Row:
    """The columns of a job the match answer reads (taskqueue.queues.jobs.jobs_for_pilot)."""

    id: int
    description: str
    description_format: str
    bulk_index: int | None
    payload: str | None
    vo: str = "lhcb"
    owner: str = "alice"
    owner_group: str = "lhcb_user"
    job_type: str = "User"


def _corpus() -> list[tuple[str, str, str]]:
    """(name, text, format) of every description of tests/data that reads."""
    out = [(name, text, "jdl") for name, text in EXTRA_TEXTS.items()]
    for folder, fmt in (("jdl", "jdl"), ("json", "json")):
        for path in sorted((DATA / folder).glob(f"*.{fmt}")):
            text = path.read_text(encoding="utf-8")
            try:
                submissions_from_text(text, fmt)
            except (JobDescriptionError, ValueError):
                continue  # an invalid description of the corpus: never stored
            out.append((f"{folder}/{path.name}", text, fmt))
    return out


CORPUS = _corpus()


def _answer_before(row: Row) -> dict[str, Any]:
    """The match answer's payload as it was built before job_payloads: the stored text read
    again, field by field."""
    desc = stored_description(row.description, row.description_format,
                              row.bulk_index).for_job(row.id)
    return JobPayload(
        job_id=row.id, vo=row.vo, owner=row.owner, owner_group=row.owner_group,
        job_type=row.job_type, executable=desc.executable, arguments=list(desc.arguments),
        environment=dict(desc.environment), cpu_time=desc.cpu_time,
        processors=desc.processors, memory=desc.memory, gpus=desc.gpus,
        input_sandbox=list(desc.input_sandbox), output_sandbox=list(desc.output_sandbox),
        stdout=desc.stdout, stderr=desc.stderr, stdin=desc.stdin, job_name=desc.job_name,
        container_image=desc.container_image, description=row.description,
        description_format=row.description_format, extra=dict(desc.extra)).to_dict()


def _bytes(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer).encode()


def test_the_corpus_holds_every_kind_of_description() -> None:
    names = [name for name, _, _ in CORPUS]
    assert len(CORPUS) >= 20
    assert any(name.startswith("json/") for name in names)
    assert any("glite" in name for name in names)
    assert any(len(submissions_from_text(text, fmt)) > 1 for _, text, fmt in CORPUS)


@pytest.mark.parametrize(("name", "text", "fmt"), CORPUS, ids=[c[0] for c in CORPUS])
def test_the_stored_payload_gives_the_answer_the_text_gave(name: str, text: str,
                                                            fmt: str) -> None:
    for i, submission in enumerate(submissions_from_text(text, fmt)):
        job_id = 7000 + i
        stored = payload_json(submission.description, job_id)
        row = Row(job_id, submission.text, submission.format, submission.bulk_index, stored)
        before = _answer_before(row)
        assert _bytes(payload(row).to_dict()) == _bytes(before), f"{name} job {i}"
        assert payload(row).to_dict() == before
        unstored = Row(job_id, submission.text, submission.format, submission.bulk_index, None)
        assert _bytes(payload(unstored).to_dict()) == _bytes(before), f"{name} job {i}"


def test_the_job_id_marks_are_the_job_s_own() -> None:
    [submission] = submissions_from_text(EXTRA_TEXTS["job-id-marks.jdl"], "jdl")
    fields = json.loads(payload_json(submission.description, 42))
    assert fields["executable"] == "run-42.sh"
    assert fields["arguments"] == ["--id", "42", "x"]
    assert fields["environment"] == {"ID": "42", "PLAIN": "1"}
    assert fields["input_sandbox"] == ["in.42", "b"]
    assert fields["job_name"] == "job 42"
    assert "%j" not in json.dumps(fields)


def test_the_stored_payload_is_compact_json_of_the_payload_fields_and_asked_scopes() -> None:
    [submission] = submissions_from_text(EXTRA_TEXTS["unicode.jdl"], "jdl")
    stored = payload_json(submission.description, 1)
    assert ": " not in stored and ", " not in stored.replace('", "', "")
    assert stored.isascii()
    assert set(json.loads(stored)) == {
        "executable", "arguments", "environment", "cpu_time", "processors", "memory", "gpus",
        "input_sandbox", "output_sandbox", "stdout", "stderr", "stdin", "job_name",
        "container_image", "extra", "token_scopes"}
