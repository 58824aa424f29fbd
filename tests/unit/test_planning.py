"""The pilot's pure decisions (pilot/planning.py), shared by the pilot loop and the simulator."""

from __future__ import annotations

import pytest

from pilot.planning import (
    UNBOUNDED_PAYLOAD_SECONDS,
    Ask,
    expected_end,
    memory_first,
    memory_left,
    payload_cores,
    payload_max_end,
    what_to_ask,
)


def test_the_ask_offers_free_cores_and_the_time_left_minus_the_margin_normalised() -> None:
    ask = what_to_ask(free_cores=3, seconds_left=1000.0, margin=60.0, cpu_factor=2.5,
                      cpu_left=None, cores=8)
    assert ask == Ask(processors=3, cpu_time_left=int(940 * 2.5))


def test_no_ask_when_the_margin_eats_the_time_left() -> None:
    assert what_to_ask(free_cores=1, seconds_left=60.0, margin=60.0, cpu_factor=None,
                       cpu_left=None, cores=1) is None


def test_a_blind_ask_offers_no_cpu_time_and_the_cpu_limit_is_shared_by_the_cores() -> None:
    assert what_to_ask(free_cores=4, seconds_left=None, margin=60.0, cpu_factor=None,
                       cpu_left=None, cores=4) == Ask(4, None)
    assert what_to_ask(free_cores=4, seconds_left=None, margin=60.0, cpu_factor=None,
                       cpu_left=4000.0, cores=4) == Ask(4, 1000)
    assert what_to_ask(free_cores=4, seconds_left=500.0, margin=0.0, cpu_factor=None,
                       cpu_left=4000.0, cores=4) == Ask(4, 500)


@pytest.mark.parametrize(("requested", "free", "cores"), [(None, 5, 1), (0, 5, 1), (4, 5, 4),
                                                          (8, 5, 5), (3, 0, 1)])
def test_payload_cores(requested: int | None, free: int, cores: int) -> None:
    assert payload_cores(requested, free) == cores


def test_payload_ends() -> None:
    assert payload_max_end(100.0, 500.0, 300.0) == 300.0
    assert payload_max_end(100.0, None, 300.0) == 300.0
    assert payload_max_end(100.0, None, None) == 100.0 + UNBOUNDED_PAYLOAD_SECONDS
    assert expected_end(100.0, 800, 2.0, 4, 10_000.0) == 200.0
    assert expected_end(100.0, 800, None, 0, 500.0) == 500.0


def test_the_ask_offers_the_memory_the_running_payloads_leave() -> None:
    # A pilot of 2 cores and 4,000 MB running a 3,000 MB job on one core offers its one free
    # core and 1,000 MB, not its second core's share (2,000 MB).
    left = memory_left(4000, [3000])
    assert left == 1000
    assert what_to_ask(free_cores=1, seconds_left=None, margin=60.0, cpu_factor=None,
                       cpu_left=None, cores=2, free_memory_mb=left) == Ask(1, None, 1000)


def test_memory_left_is_never_negative_and_unknown_without_the_pilots_memory() -> None:
    assert memory_left(4000, []) == 4000
    assert memory_left(4000, [3000, 2000]) == 0
    assert memory_left(None, [3000]) is None


def test_memory_first_narrows_to_one_core_and_the_memory_left_per_free_core() -> None:
    # 32 cores and 64,000 MB: a 6,000 MB job leaves 58,000 MB for 31 cores (1,870 a core).
    ask = Ask(processors=31, cpu_time_left=3600, memory=58000)
    assert memory_first(ask, memory_mb=64000, cores=32) == Ask(1, 3600, 1870 + 1870 // 8)
    # Memory left above the share per core, one free core, or memory not known: no narrower
    # ask.
    assert memory_first(Ask(8, 3600, 20000), memory_mb=64000, cores=32) is None
    assert memory_first(Ask(1, 3600, 1000), memory_mb=64000, cores=32) is None
    assert memory_first(Ask(8, 3600, None), memory_mb=None, cores=32) is None
    # The slack for the buckets' rounding never offers more than is left.
    assert memory_first(Ask(2, None, 100), memory_mb=64000, cores=32) == Ask(1, None, 56)
