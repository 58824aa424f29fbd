from __future__ import annotations

import pytest

from taskqueue.core.states import FINAL_STATES, TRANSITIONS, JobStatus, is_allowed

S = JobStatus

#: Position of each status on the way of a job; Stalled is a side state of Running (a stalled
#: job whose pilot speaks again resumes), Rescheduled is the one way back.
ORDER = {S.RECEIVED: 0, S.CHECKING: 1, S.WAITING: 2, S.MATCHED: 3, S.RUNNING: 4, S.STALLED: 4,
         S.COMPLETING: 5, S.DONE: 6, S.FAILED: 6, S.KILLED: 6, S.DELETED: 7}


def test_every_status_has_a_row() -> None:
    assert set(TRANSITIONS) == set(JobStatus)


@pytest.mark.parametrize("current", list(JobStatus))
def test_jobs_never_go_backwards_except_through_rescheduled(current: JobStatus) -> None:
    for new in TRANSITIONS[current]:
        if S.RESCHEDULED in (current, new):
            continue
        assert ORDER[new] >= ORDER[current], f"{current} -> {new} goes backwards"


def test_rescheduled_returns_to_the_optimizer_chain() -> None:
    assert is_allowed(S.RESCHEDULED, S.RECEIVED)
    assert not is_allowed(S.RESCHEDULED, S.WAITING)
    assert not is_allowed(S.RESCHEDULED, S.MATCHED)


@pytest.mark.parametrize(("current", "new"), [
    (S.WAITING, S.RUNNING), (S.DONE, S.RUNNING), (S.MATCHED, S.WAITING), (S.RUNNING, S.MATCHED),
    (S.RECEIVED, S.WAITING), (S.DELETED, S.RECEIVED), (S.KILLED, S.DONE), (S.DONE, S.FAILED),
])
def test_illegal_moves(current: JobStatus, new: JobStatus) -> None:
    assert not is_allowed(current, new)


def test_deleted_is_the_end() -> None:
    assert TRANSITIONS[S.DELETED] == frozenset()
    assert {S.DONE, S.FAILED, S.KILLED, S.DELETED} <= FINAL_STATES
    for final in FINAL_STATES:
        assert TRANSITIONS[final] <= {S.DELETED, S.RESCHEDULED}
