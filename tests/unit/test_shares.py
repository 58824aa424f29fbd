from __future__ import annotations

import pytest

from taskqueue.queues.shares import (
    MIN_PRIORITY_FRACTION,
    QueueShareInput,
    compute_priorities,
    rescaled_key,
)


def q(tq_id: int, group: str, owner: str | None, mean: float, vo: str = "lhcb") -> QueueShareInput:
    return QueueShareInput(tq_id, vo, group, owner, mean)


def test_shared_group_splits_by_mean_priority() -> None:
    prios = compute_priorities([q(1, "prod", None, 1.0), q(2, "prod", None, 3.0)], {"prod": 4.0})
    assert prios == pytest.approx({1: 1.0, 2: 3.0})


def test_non_sharing_group_splits_per_owner_first() -> None:
    # alice has two queues, bob one: each owner gets half of the group's 3.0
    prios = compute_priorities(
        [q(1, "user", "alice", 2.0), q(2, "user", "alice", 1.0), q(3, "user", "bob", 5.0)],
        {"user": 3.0})
    assert prios == pytest.approx({1: 1.0, 2: 0.5, 3: 1.5})


def test_groups_are_independent_and_default_share_applies() -> None:
    prios = compute_priorities([q(1, "a", None, 1.0), q(2, "b", None, 1.0)], {"a": 2.0},
                               default_share=0.5)
    assert prios == pytest.approx({1: 2.0, 2: 0.5})


def test_all_zero_priorities_split_evenly() -> None:
    prios = compute_priorities([q(1, "g", None, 0.0), q(2, "g", None, 0.0)], {"g": 1.0})
    assert prios == pytest.approx({1: 0.5, 2: 0.5})


def test_zero_priority_queue_keeps_a_positive_weight() -> None:
    prios = compute_priorities([q(1, "g", None, 0.0), q(2, "g", None, 4.0)], {"g": 2.0})
    assert prios[2] == pytest.approx(2.0)
    assert prios[1] == pytest.approx(2.0 * MIN_PRIORITY_FRACTION)


def test_same_group_name_in_two_vos_is_two_entities() -> None:
    prios = compute_priorities([q(1, "g", None, 1.0, vo="a"), q(2, "g", None, 1.0, vo="b")],
                               {"g": 1.0})
    assert prios == pytest.approx({1: 1.0, 2: 1.0})


def test_rescaled_key_keeps_the_clock_exponential() -> None:
    # 10 units left at rate 1 become 5 units left at rate 2
    assert rescaled_key(110.0, 100.0, 1.0, 2.0) == pytest.approx(105.0)
    # a key behind the current time is not moved
    assert rescaled_key(90.0, 100.0, 1.0, 2.0) == 90.0
