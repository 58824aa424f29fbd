"""The waste formulas: hand-computed values, the clamping conventions, and properties checked
against a brute-force count of idle and committed core-seconds."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.jobstatus import JobStatusValues, RunningPayload, compute_status
from pilot.waste import draining_waste, kill_waste, remaining_time

# The 4-core pilot of test_jobstatus: a 1-core payload (start 1000, expected end 5000, limit
# 9000) and a 2-core one (start 2000, expected end 4000, limit 8000), written at 3000:
# used 3, last_job_start 2000, first/last expected end 4000/5000, last limit 9000,
# add_uncom_time 1000, add_final_exp_waste 3000.
ONE = RunningPayload(cores=1, start=1000, expected_end=5000, max_end=9000)
TWO = RunningPayload(cores=2, start=2000, expected_end=4000, max_end=8000)
VALUES = compute_status(4, [ONE, TWO], now=3000, can_postpone=False, priority_factor=1)


def test_remaining_time_by_hand() -> None:
    assert remaining_time(VALUES, 3500) == 1500          # 5000 - 3500
    assert remaining_time(VALUES, 3500, enforced=True) == 5500   # 9000 - 3500


def test_draining_waste_by_hand() -> None:
    # (4 - 3) * (4000 - 3500) + 3000 = 3500; by counting: the free core idles 3500..5000
    # (1500), the 2-core payload's cores idle 4000..5000 (2 * 1000), the 1-core payload's none.
    assert draining_waste(VALUES, 3500) == 3500
    assert draining_waste(VALUES, 3500, allocated=4) == 3500
    # The formula's own allocated_CPU term (add_final_exp_waste was written for 4 cores):
    # (6 - 3) * (4000 - 3500) + 3000.
    assert draining_waste(VALUES, 3500, allocated=6) == 4500


def test_kill_waste_by_hand() -> None:
    # 1000 + 3 * (3500 - 2000) = 5500; by counting: 1 core * 2500 s + 2 cores * 1500 s.
    assert kill_waste(VALUES, 3500) == 5500


def test_draining_waste_without_allocated_cpu_counts_no_free_core() -> None:
    unknown = replace(VALUES, allocated_CPU=None)
    assert draining_waste(unknown, 3500) == VALUES.add_final_exp_waste   # 0 * 500 + 3000
    assert draining_waste(unknown, 3500, allocated=4) == 3500


def test_a_pilot_without_payload_wastes_nothing() -> None:
    empty = compute_status(8, [], now=3000, can_postpone=False, priority_factor=1)
    for now in (3000, 3001, 99999):
        assert remaining_time(empty, now) == 0
        assert remaining_time(empty, now, enforced=True) == 0
        assert draining_waste(empty, now) == 0
        assert kill_waste(empty, now) == 0


def test_an_end_already_past_leaves_no_remaining_time() -> None:
    assert remaining_time(VALUES, 6000) == 0
    assert remaining_time(VALUES, 6000, enforced=True) == 3000
    assert remaining_time(VALUES, 10000, enforced=True) == 0


def test_draining_waste_past_the_first_expected_end_extrapolates_then_stops_at_zero() -> None:
    # At 4500 the first expected end is past: the free core still idles until 5000 (500) and
    # the formula says 1 * (4000 - 4500) + 3000 = 2500 (not clamped to 0 * ... + 3000).
    assert draining_waste(VALUES, 4500) == 2500
    # Past the last expected end: 1 * (4000 - 9000) + 3000 < 0, clamped.
    assert draining_waste(VALUES, 9000) == 0


def test_over_committed_pilot_counts_no_negative_idle_cores() -> None:
    assert draining_waste(VALUES, 3500, allocated=1) == VALUES.add_final_exp_waste


def test_kill_waste_before_the_last_start_counts_no_negative_work() -> None:
    assert kill_waste(VALUES, 1500) == VALUES.add_uncom_time   # not 1000 + 3 * (1500 - 2000)
    assert kill_waste(VALUES, 2000) == VALUES.add_uncom_time


def test_garbage_free_values_stay_non_negative_even_when_odd() -> None:
    odd = JobStatusValues(used_CPU=2, last_job_start=5000, first_exp_job_end=100,
                          last_exp_job_end=50, last_max_job_end=10, add_uncom_time=0,
                          add_final_exp_waste=0, can_postpone_last_job=False,
                          priority_factor=0, allocated_CPU=4)
    assert remaining_time(odd, 1000) == 0
    assert draining_waste(odd, 1000) == 0
    assert kill_waste(odd, 1000) == 0


# -- properties -------------------------------------------------------------------------------

PROPS = settings(max_examples=300, deadline=None, database=None)
T0 = 1_700_000_000


@st.composite
def pilots(draw: st.DrawFn) -> tuple[int, list[RunningPayload], int]:
    """A consistent pilot: integer times (exact float arithmetic), every payload with
    start <= now <= expected end <= limit, used cores <= allocated."""
    now = T0 + draw(st.integers(0, 10**6))
    payloads = []
    for _ in range(draw(st.integers(0, 8))):
        start = now - draw(st.integers(0, 10**6))
        expected = now + draw(st.integers(0, 10**6))
        limit = expected + draw(st.integers(0, 10**6))
        payloads.append(RunningPayload(draw(st.integers(1, 16)), start, expected, limit))
    used = sum(p.cores for p in payloads)
    allocated = used + draw(st.integers(0 if payloads else 1, 16))
    return allocated, payloads, now


def status(allocated: int, payloads: list[RunningPayload], now: int) -> JobStatusValues:
    return compute_status(allocated, payloads, now=now, can_postpone=False, priority_factor=1)


def idle_core_seconds(allocated: int, payloads: list[RunningPayload], now: int) -> int:
    """Brute force: drain at ``now``, every payload ends as expected; count idle core-seconds
    until the last one ends."""
    if not payloads:
        return 0
    end = max(int(p.expected_end) for p in payloads)
    free = allocated - sum(p.cores for p in payloads)
    return free * (end - now) + sum(p.cores * (end - int(p.expected_end)) for p in payloads)


def committed_core_seconds(payloads: list[RunningPayload], now: int) -> int:
    return sum(p.cores * (now - int(p.start)) for p in payloads)


@PROPS
@given(pilots(), st.integers(0, 3 * 10**6))
def test_waste_is_never_negative(pilot: tuple[int, list[RunningPayload], int],
                                 later: int) -> None:
    allocated, payloads, now = pilot
    values = status(allocated, payloads, now)
    for t in (now, now + later):
        assert remaining_time(values, t) >= 0
        assert remaining_time(values, t, enforced=True) >= 0
        assert draining_waste(values, t) >= 0
        assert kill_waste(values, t) >= 0


@PROPS
@given(pilots())
def test_the_formulas_count_what_they_claim(pilot: tuple[int, list[RunningPayload], int]
                                            ) -> None:
    allocated, payloads, now = pilot
    values = status(allocated, payloads, now)
    assert draining_waste(values, now) == idle_core_seconds(allocated, payloads, now)
    assert kill_waste(values, now) == committed_core_seconds(payloads, now)
    ends = [p.expected_end for p in payloads] or [now]
    assert remaining_time(values, now) == max(ends) - now
    assert remaining_time(values, now, enforced=True) >= remaining_time(values, now)


@PROPS
@given(pilots(), st.integers(-10**6, 3 * 10**6), st.integers(0, 3 * 10**6))
def test_kill_waste_never_decreases_with_time(pilot: tuple[int, list[RunningPayload], int],
                                              offset: int, step: int) -> None:
    allocated, payloads, now = pilot
    values = status(allocated, payloads, now)
    assert kill_waste(values, now + offset) <= kill_waste(values, now + offset + step)


@PROPS
@given(pilots(), st.floats(0, 1), st.floats(0, 1))
def test_draining_waste_never_increases_until_the_first_expected_end(
        pilot: tuple[int, list[RunningPayload], int], a: float, b: float) -> None:
    allocated, payloads, now = pilot
    values = status(allocated, payloads, now)
    span = values.first_exp_job_end - now
    t1, t2 = sorted((now + a * span, now + b * span))
    assert t2 <= values.first_exp_job_end
    assert draining_waste(values, t1) >= draining_waste(values, t2)


@PROPS
@given(pilots(), st.floats(0, 1))
def test_values_written_earlier_still_hold_later(pilot: tuple[int, list[RunningPayload], int],
                                                 a: float) -> None:
    """Until the first expected end, the values written at ``now`` give the same wastes at a
    later time as values written at that time."""
    allocated, payloads, now = pilot
    values = status(allocated, payloads, now)
    later = now + int(a * (values.first_exp_job_end - now))
    fresh = status(allocated, payloads, later)
    assert draining_waste(values, later) == draining_waste(fresh, later)
    assert kill_waste(values, later) == kill_waste(fresh, later)
    assert remaining_time(values, later) == remaining_time(fresh, later)
