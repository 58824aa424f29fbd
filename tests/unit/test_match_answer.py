"""A job in a match answer, as the pilot reads it: every field the matcher sends comes back
as it went, and a field of the wrong type is refused, naming the field (issue 33 item 10)."""

from __future__ import annotations

from typing import Any

import pytest

from pilot.protocol import JobPayload

JOB = JobPayload(job_id=7, vo="lhcb", owner="alice", owner_group="lhcb_user",
                 job_type="User", executable="run.sh", arguments=["-n", "3"],
                 environment={"A": "1"}, cpu_time=3600, processors=2, memory=2048,
                 input_sandbox=["sb:sha256:" + "0" * 64], output_sandbox=["out.txt"],
                 stdout="std.out", stderr=None, job_name="j", description="[]",
                 extra={"Priority": 3})


def test_every_field_comes_back_as_it_went() -> None:
    assert JobPayload.from_dict(JOB.to_dict()) == JOB


@pytest.mark.parametrize(("field", "value"), [
    ("job_id", "7"), ("job_id", True), ("job_id", 0), ("vo", None), ("executable", 3),
    ("arguments", "-n 3"), ("arguments", [1]), ("environment", ["A=1"]),
    ("environment", {"A": 1}), ("processors", 1.5), ("memory", False), ("stdout", 1),
    ("input_sandbox", "sb"), ("extra", []),
])
def test_a_field_of_the_wrong_type_is_refused(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match="job_id|" + field):
        JobPayload.from_dict({**JOB.to_dict(), field: value})


def test_a_job_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError, match="not an object"):
        JobPayload.from_dict([1, 2])  # type: ignore[arg-type]


def test_every_field_of_a_job_payload_is_read_from_the_answer() -> None:
    """A field the matcher sends that the pilot's reader does not know would be dropped."""
    from dataclasses import fields

    from pilot.protocol import _FIELD_KINDS, JobPayload

    assert set(_FIELD_KINDS) == {f.name for f in fields(JobPayload)}
