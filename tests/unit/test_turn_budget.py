"""A CE's time in one turn (agents.ce.budget): the time during which some request to it is
under way, once, however many run side by side."""

from __future__ import annotations

from agents.ce.budget import TurnBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_requests_side_by_side_count_their_time_once() -> None:
    clock = Clock()
    budget = TurnBudget(3.0, clock=clock)
    budget.start_turn()
    first, second = budget.request(), budget.request()
    first.__enter__()
    second.__enter__()
    clock.now += 1.0
    assert budget.left() == 2.0  # under way: counted as it goes
    first.__exit__(None, None, None)
    second.__exit__(None, None, None)
    assert budget.left() == 2.0 and not budget.over()
    with budget.request():
        clock.now += 2.0
    assert budget.left() == 0.0 and budget.over()


def test_time_between_requests_does_not_count_and_a_new_turn_starts_afresh() -> None:
    clock = Clock()
    budget = TurnBudget(3.0, clock=clock)
    budget.start_turn()
    with budget.request():
        clock.now += 2.5
    clock.now += 10.0  # the loop's own work, or another CE's
    assert budget.left() == 0.5
    with budget.request():
        clock.now += 1.0
    assert budget.over()
    budget.start_turn()
    assert budget.left() == 3.0
