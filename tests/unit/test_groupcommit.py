"""taskqueue.db.groupcommit.GroupCommit: concurrent calls go together in the next group, a lone
call runs at once, each caller gets its own answer or error, and no caller is left waiting
whatever the group's run does. The groups are forced deterministically: a run that blocks
until the test lets it go holds the lead while the others queue."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from taskqueue.db.groupcommit import GroupCommit

#: How long a test waits for a thread before it calls the group stuck (never a timing
#: assertion: a correct group answers at once).
PATIENCE = 30.0


class Gate:
    """A run that records its groups and, while ``closed``, blocks its first group."""

    def __init__(self, answer: Callable[[int], Any] = lambda item: item * 10) -> None:
        self.groups: list[list[int]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.answer = answer

    def __call__(self, items: Sequence[int]) -> list[Any]:
        self.groups.append(list(items))
        if len(self.groups) == 1:
            self.entered.set()
            assert self.release.wait(PATIENCE)
        return [self.answer(item) for item in items]


def start(group: GroupCommit[int, Any], items: Sequence[int],
          answers: dict[int, Any]) -> list[threading.Thread]:
    def one(item: int) -> None:
        try:
            answers[item] = group.call(item)
        except Exception as exc:  # kept as the item's answer
            answers[item] = exc

    threads = [threading.Thread(target=one, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    return threads


def queued_behind_the_leader(group: GroupCommit[int, Any], count: int) -> None:
    """Wait until ``count`` calls queue behind the running group."""
    for _ in range(int(PATIENCE * 1000)):
        if group.queued == count:
            return
        threading.Event().wait(0.001)
    raise AssertionError(f"{count} calls never queued")


def join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(PATIENCE)
        assert not thread.is_alive(), "a caller was left waiting"


def test_a_lone_call_runs_at_once_as_a_group_of_one() -> None:
    seen: list[list[int]] = []

    def run(items: Sequence[int]) -> list[int]:
        seen.append(list(items))
        return [item + 1 for item in items]

    group = GroupCommit(run)
    assert [group.call(1), group.call(2)] == [2, 3]
    assert seen == [[1], [2]]
    assert (group.groups, group.calls) == (2, 2)


def test_calls_that_arrive_while_a_group_runs_go_together_in_the_next() -> None:
    gate = Gate()
    group: GroupCommit[int, Any] = GroupCommit(gate, most=8)
    answers: dict[int, Any] = {}
    first = start(group, [0], answers)
    assert gate.entered.wait(PATIENCE)
    rest = start(group, [1, 2, 3, 4], answers)
    queued_behind_the_leader(group, 4)
    gate.release.set()
    join(first + rest)
    assert gate.groups[0] == [0]
    assert sorted(gate.groups[1]) == [1, 2, 3, 4] and len(gate.groups) == 2
    assert answers == {0: 0, 1: 10, 2: 20, 3: 30, 4: 40}  # each its own answer
    assert (group.groups, group.calls) == (2, 5)


def test_a_group_holds_at_most_most_calls_and_the_rest_follow() -> None:
    gate = Gate()
    group: GroupCommit[int, Any] = GroupCommit(gate, most=3)
    answers: dict[int, Any] = {}
    first = start(group, [0], answers)
    assert gate.entered.wait(PATIENCE)
    rest = start(group, list(range(1, 8)), answers)
    queued_behind_the_leader(group, 7)
    gate.release.set()
    join(first + rest)
    assert [len(g) for g in gate.groups] == [1, 3, 3, 1]
    assert sorted(i for g in gate.groups for i in g) == list(range(8))
    assert answers == {i: i * 10 for i in range(8)}


def test_an_item_s_error_is_its_caller_s_alone() -> None:
    def answer(item: int) -> Any:
        return ValueError(f"item {item} refused") if item == 2 else item

    gate = Gate(answer)
    group: GroupCommit[int, Any] = GroupCommit(gate)
    answers: dict[int, Any] = {}
    first = start(group, [0], answers)
    assert gate.entered.wait(PATIENCE)
    rest = start(group, [1, 2, 3], answers)
    queued_behind_the_leader(group, 3)
    gate.release.set()
    join(first + rest)
    assert isinstance(answers[2], ValueError) and str(answers[2]) == "item 2 refused"
    assert [answers[i] for i in (0, 1, 3)] == [0, 1, 3]


@pytest.mark.parametrize("failure", [RuntimeError("the database went away"),
                                     KeyboardInterrupt()])
def test_a_run_that_raises_fails_its_whole_group_and_the_next_group_still_runs(
        failure: BaseException) -> None:
    calls: list[list[int]] = []
    entered, release = threading.Event(), threading.Event()

    def run(items: Sequence[int]) -> list[int]:
        calls.append(list(items))
        if len(calls) == 1:
            entered.set()
            assert release.wait(PATIENCE)
            return list(items)
        if len(calls) == 2:
            raise failure
        return [item * 2 for item in items]

    group = GroupCommit(run)
    answers: dict[int, Any] = {}
    errors: list[BaseException] = []

    def interrupted(item: int) -> None:  # a KeyboardInterrupt is not an Exception
        try:
            answers[item] = group.call(item)
        except BaseException as exc:
            errors.append(exc)

    first = start(group, [0], answers)
    assert entered.wait(PATIENCE)
    rest = [threading.Thread(target=interrupted, args=(item,)) for item in (1, 2)]
    for thread in rest:
        thread.start()
    queued_behind_the_leader(group, 2)
    release.set()
    join(first + rest)
    assert answers == {0: 0}
    assert errors == [failure, failure]  # both callers of the failed group
    assert group.call(5) == 10  # the lead was handed back: nothing is stuck
    assert group.running == 0


def test_a_wrong_number_of_answers_is_an_error_for_the_group() -> None:
    group: GroupCommit[int, int] = GroupCommit(lambda items: [])
    with pytest.raises(RuntimeError, match="a group of 1 calls got 0 answers"):
        group.call(1)
    assert group.running == 0


def test_a_group_needs_room_for_one_call_and_one_lane() -> None:
    with pytest.raises(ValueError, match="at least one call, not 0"):
        GroupCommit(lambda items: list(items), most=0)
    with pytest.raises(ValueError, match="at least one lane, not 0"):
        GroupCommit(lambda items: list(items), lanes=0)


def test_with_two_lanes_a_second_call_runs_beside_a_held_group_and_the_rest_queue() -> None:
    held = threading.Event()
    release = threading.Event()
    runs: list[list[int]] = []

    def run(items: Sequence[int]) -> list[int]:
        runs.append(list(items))
        if items[0] in (0, 1):  # the first two calls hold both lanes until released
            held.set()
            assert release.wait(PATIENCE)
        return list(items)

    group = GroupCommit(run, most=8, lanes=2)
    answers: dict[int, Any] = {}
    threads = start(group, [0], answers)
    assert held.wait(PATIENCE)
    threads += start(group, [1], answers)  # a free lane: runs at once, not queued
    for _ in range(int(PATIENCE * 1000)):
        if len(runs) == 2:
            break
        threading.Event().wait(0.001)
    assert sorted(map(tuple, runs)) == [(0,), (1,)] and group.running == 2
    threads += start(group, [2, 3, 4], answers)
    queued_behind_the_leader(group, 3)
    release.set()
    join(threads)
    assert answers == {i: i for i in range(5)}
    assert sorted(i for r in runs[2:] for i in r) == [2, 3, 4]
    assert group.running == 0 and group.calls == 5


def test_many_threads_on_two_lanes_hand_lanes_on_without_losing_one() -> None:
    group = GroupCommit(lambda items: [item + 1 for item in items], most=3, lanes=2)
    for _ in range(5):
        answers: dict[int, Any] = {}
        join(start(group, list(range(100)), answers))
        assert answers == {i: i + 1 for i in range(100)}
        assert group.running == 0 and group.queued == 0


def test_many_threads_each_get_their_own_answer_exactly_once() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def run(items: Sequence[int]) -> list[int]:
        with lock:
            seen.extend(items)
        return [-item for item in items]

    group = GroupCommit(run, most=4)
    answers: dict[int, Any] = {}
    join(start(group, list(range(200)), answers))
    assert answers == {i: -i for i in range(200)}
    assert sorted(seen) == list(range(200))
    assert group.calls == 200 and group.running == 0
