"""The pilot's pure decisions (pilot/planning.py), shared by the pilot loop and the simulator."""

from __future__ import annotations

import pytest

from pilot.planning import (
    UNBOUNDED_PAYLOAD_SECONDS,
    Ask,
    expected_end,
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
