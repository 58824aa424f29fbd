"""The pilot's decisions about what to ask for and how to run what it gets, as pure functions
of numbers (no I/O, no clock): the pilot's loop calls them with the real time and features, the
site simulator (``gridpilot simulate``) with simulated ones.

- :func:`what_to_ask`: the free cores and the normalised CPU time left that a match request
  offers, or None when no time is left for another job.
- :func:`payload_cores`: the cores a matched job gets.
- :func:`payload_gpus`: the GPU devices a matched job gets, and :func:`gpu_environment` the
  variables that show a payload those devices only.
- :func:`payload_max_end`: when a payload must end (the wall limit or the shutdown time).
- :func:`expected_end`: when a payload is expected to end, from the CPU time it asked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: A payload's enforced end when neither a wall limit nor a shutdown time is known.
UNBOUNDED_PAYLOAD_SECONDS = 7 * 86400.0


@dataclass(frozen=True)
class Ask:
    """What one match request offers: free cores, and normalised CPU seconds left (per core;
    None: no limit known)."""

    processors: int
    cpu_time_left: int | None


def what_to_ask(*, free_cores: int, seconds_left: float | None, margin: float,
                cpu_factor: float | None, cpu_left: float | None, cores: int) -> Ask | None:
    """The match request of a pilot with ``free_cores`` of its ``cores`` free.

    ``seconds_left``: real seconds to the earlier of the wall limit and the shutdown time (None:
    neither known); ``margin``: seconds kept free before that end; ``cpu_factor``: the node's
    CPU normalisation factor (None: 1); ``cpu_left``: normalised CPU seconds left to the whole
    pilot (None: no CPU limit). Returns None when ``seconds_left - margin`` leaves no time."""
    factor = cpu_factor or 1.0
    cpu_time: int | None = None
    if seconds_left is not None:
        seconds = seconds_left - margin
        if seconds <= 0:
            return None
        cpu_time = int(seconds * factor)
    if cpu_left is not None:
        per_core = int(cpu_left / cores)
        cpu_time = per_core if cpu_time is None else min(cpu_time, per_core)
    return Ask(processors=free_cores, cpu_time_left=cpu_time)


def payload_cores(requested: int | None, free_cores: int) -> int:
    """The cores a job asking for ``requested`` processors gets from ``free_cores``: at least
    one, at most what is free."""
    return max(1, min(requested or 1, free_cores))


def payload_gpus(requested: int, devices: tuple[str, ...], held: Iterable[str]
                 ) -> tuple[str, ...]:
    """The devices a job asking for ``requested`` GPUs gets: the first of the pilot's
    ``devices`` that no running payload ``held``, at most ``requested`` of them."""
    taken = set(held)
    return tuple(d for d in devices if d not in taken)[:max(requested, 0)]


#: The variables that name the devices a payload may use: NVIDIA CUDA, AMD ROCm, Intel oneAPI
#: Level Zero, and gridpilot's own.
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK",
                 "GRIDPILOT_JOB_GPUS")


def gpu_environment(devices: tuple[str, ...]) -> dict[str, str]:
    """The environment that shows a payload ``devices`` (comma-separated ids) and no other
    GPU of the pilot's: empty for a payload that got none."""
    ids = ",".join(devices)
    return dict.fromkeys(GPU_VARIABLES, ids)


def payload_max_end(now: float, wall_end: float | None, shutdown: float | None) -> float:
    """When a payload started at ``now`` must end: the earlier of the pilot's wall limit and
    the node's shutdown time (a week from now when neither is known)."""
    ends = [end for end in (wall_end, shutdown) if end is not None]
    return min(ends) if ends else now + UNBOUNDED_PAYLOAD_SECONDS


def expected_end(now: float, cpu_time: float, cpu_factor: float | None, cores: int,
                 max_end: float) -> float:
    """When a payload started at ``now`` is expected to end: its requested (normalised) CPU
    time, in real seconds, spread over its cores; never after ``max_end``."""
    factor = cpu_factor or 1.0
    return min(now + cpu_time / factor / max(cores, 1), max_end)
