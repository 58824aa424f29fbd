"""The pilot's decisions about what to ask for and how to run what it gets, as pure functions
of numbers (no I/O, no clock): the pilot's loop calls them with the real time and features, the
site simulator (``gridpilot simulate``) with simulated ones.

- :func:`what_to_ask`: the free cores, the memory left and the normalised CPU time left that a
  match request offers, or None when no time is left for another job.
- :func:`memory_left`: the memory a pilot's running payloads leave it.
- :func:`memory_first`: a narrower ask to try first when memory, not cores, runs out (a what-if
  the simulator measures; the pilot does not ask it).
- :func:`payload_cores`: the cores a matched job gets.
- :func:`payload_gpus`: the GPU devices a matched job gets, and :func:`gpu_environment` the
  variables that show a payload those devices only.
- :func:`payload_max_end`: when a payload must end (the wall limit or the shutdown time).
- :func:`expected_end`: when a payload is expected to end, from the CPU time it asked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: The task queues round a job's memory up to 3 significant bits (at most an eighth more:
#: 2,000 MB is 2,048): a narrower ask offers that much more per core than it has left.
MEMORY_BUCKET_SLACK = 8

#: A payload's enforced end when neither a wall limit nor a shutdown time is known.
UNBOUNDED_PAYLOAD_SECONDS = 7 * 86400.0


@dataclass(frozen=True)
class Ask:
    """What one match request offers: free cores, normalised CPU seconds left (per core;
    None: no limit known) and free memory (MB; None: not known, any memory)."""

    processors: int
    cpu_time_left: int | None
    memory: int | None = None


def what_to_ask(*, free_cores: int, seconds_left: float | None, margin: float,
                cpu_factor: float | None, cpu_left: float | None, cores: int,
                free_memory_mb: int | None = None) -> Ask | None:
    """The match request of a pilot with ``free_cores`` of its ``cores`` and
    ``free_memory_mb`` of its memory free (what its running payloads leave, as
    :func:`memory_left` counts it; None: memory not known).

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
    return Ask(processors=free_cores, cpu_time_left=cpu_time, memory=free_memory_mb)


def memory_left(memory_mb: int | None, running: Iterable[int]) -> int | None:
    """The memory (MB) a pilot holding ``memory_mb`` has left while payloads holding
    ``running`` MB run: never below 0; None when the pilot's memory is not known."""
    if memory_mb is None:
        return None
    return max(0, memory_mb - sum(running))


def memory_first(ask: Ask, *, memory_mb: int | None, cores: int) -> Ask | None:
    """The ask to try before ``ask`` when memory binds, or None when it does not.

    Memory binds when the memory left per free core is not above the pilot's own share per
    core (``memory_mb`` / ``cores``): the payloads running hold their cores' share or more, and a
    job taking more than the memory left per core would leave the last cores without memory
    to run anything. The narrower ask offers one core and that memory per free core, so the
    job it gets keeps the rest fillable; when it gets nothing, the pilot asks ``ask`` (any
    job that fits what is left), so a job needing more memory per core than its pilot's share
    still runs. The narrower ask offers an eighth more per core than is left (never more than
    ``ask`` offers): the task queues round a job's memory up by as much."""
    if ask.memory is None or memory_mb is None or ask.processors <= 1:
        return None
    per_core = ask.memory // ask.processors
    if per_core * cores > memory_mb:
        return None
    return Ask(processors=1, cpu_time_left=ask.cpu_time_left,
               memory=min(ask.memory, per_core + per_core // MEMORY_BUCKET_SLACK))


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
