"""The GPUs a pilot hands out (``--gpus``): which devices a payload gets, what its environment
says of them, and what a match request offers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pilot.cli import gpu_ids, parser, pilot_options
from pilot.payload import start_payload
from pilot.planning import GPU_VARIABLES, gpu_environment, payload_gpus
from pilot.protocol import JobPayload
from pilot.resource import NodeDescription


def test_a_payload_gets_free_devices_only() -> None:
    devices = ("0", "1", "2")
    assert payload_gpus(1, devices, []) == ("0",)
    assert payload_gpus(2, devices, ["0"]) == ("1", "2")
    assert payload_gpus(1, devices, ["0", "1", "2"]) == ()
    assert payload_gpus(0, devices, []) == ()


def test_the_environment_names_the_devices_for_each_vendor() -> None:
    assert gpu_environment(("1", "3")) == dict.fromkeys(GPU_VARIABLES, "1,3")
    assert set(GPU_VARIABLES) >= {"CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                                  "ZE_AFFINITY_MASK", "GRIDPILOT_JOB_GPUS"}
    # A payload without GPUs on a pilot with some sees none of them.
    assert gpu_environment(()) == dict.fromkeys(GPU_VARIABLES, "")


def test_the_match_request_offers_the_free_gpus() -> None:
    node = NodeDescription(vo="lhcb", reference="p")
    assert "gpus" not in node.resource(free_cores=1, free_memory_mb=None, cpu_time_left=None)
    assert node.resource(free_cores=1, free_memory_mb=None, cpu_time_left=None,
                         free_gpus=2)["gpus"] == 2


def test_a_match_answer_carries_the_jobs_gpus() -> None:
    base = {"job_id": 1, "vo": "v", "owner": "o", "owner_group": "g", "job_type": "User",
            "executable": "x"}
    assert JobPayload.from_dict({**base, "gpus": 2}).gpus == 2
    assert JobPayload.from_dict(base).gpus == 0
    with pytest.raises(ValueError, match="field gpus"):
        JobPayload.from_dict({**base, "gpus": "2"})


def test_gpus_option(tmp_path: Path) -> None:
    args = parser().parse_args(["--matcher", "http://x", "--vo", "lhcb", "--gpus", "0, 1",
                                "--workdir", str(tmp_path)])
    problems: list[str] = []
    options = pilot_options(args, "token", problems)
    assert options is not None and options.gpus == ("0", "1"), problems


@pytest.mark.parametrize(("text", "problem"), [
    ("0,,1", "--gpus must be comma-separated device ids such as 0,1, got '0,,1'"),
    ("0;rm", "--gpus must be comma-separated device ids such as 0,1, got '0;rm'"),
    ("0,0", "--gpus names a device twice: '0,0'"),
    (",".join(map(str, range(65))), "--gpus names 65 devices, at most 64 are taken"),
])
def test_bad_gpus_are_refused_clearly(text: str, problem: str) -> None:
    problems: list[str] = []
    gpu_ids(text, problems)
    assert problems == [problem]
    none: list[str] = []
    assert gpu_ids("", none) == () and none == []


def test_a_jobs_own_environment_cannot_name_other_devices(tmp_path: Path) -> None:
    job = JobPayload(job_id=4, vo="lhcb", owner="alice", owner_group="lhcb_user",
                     job_type="User", executable="/bin/sh", gpus=1,
                     environment={"CUDA_VISIBLE_DEVICES": "0,1", "ZE_AFFINITY_MASK": "0"},
                     arguments=["-c", 'echo "$CUDA_VISIBLE_DEVICES|$ROCR_VISIBLE_DEVICES|'
                                '$ZE_AFFINITY_MASK|$GRIDPILOT_JOB_GPUS" > seen'])
    now = time.time()
    payload = start_payload(job, cores=1, memory_mb=0, root=tmp_path / "work", now=now,
                            max_end=now + 60, cpu_factor=None, machine_features=None,
                            base_env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"},
                            gpu_env=gpu_environment(("1",)))
    assert payload.wait() == 0, payload.tail()
    assert (payload.directory / "seen").read_text() == "1|1|1|1\n"
