"""Rounding of job requirements into task-queue buckets, so that the number of queues stays small.

The job keeps its exact values; only the task-queue key is rounded, and always up, so that a
queue never promises a resource less than any of its jobs needs.
"""

from __future__ import annotations

from collections.abc import Sequence

from taskqueue.core.errors import InvalidInputError


def cpu_time_bucket(seconds: int, segments: Sequence[int]) -> int:
    """The smallest segment ≥ ``seconds``; beyond the last segment, the last segment's multiple."""
    if seconds < 0:
        raise InvalidInputError(f"CPU time must not be negative, got {seconds}")
    for bound in segments:
        if seconds <= bound:
            return bound
    last = segments[-1]
    return -(-seconds // last) * last


def significant_bits_bucket(value: int, bits: int = 3) -> int:
    """``value`` rounded up to ``bits`` significant bits: 9 → 10, 100 → 112, 3000 → 3072."""
    if value < 0:
        raise InvalidInputError(f"a processor or memory requirement must not be negative, "
                                f"got {value}")
    if value == 0:
        return 0
    shift = max(value.bit_length() - bits, 0)
    return -(-value >> shift) << shift


def memory_text(megabytes: int | None) -> str:
    """A job's or task queue's memory as people read it, the same everywhere: "any memory"
    when it asks for none in particular (0), else megabytes."""
    return f"{megabytes:,} MB" if megabytes else "any memory"
