"""The job state machine: the states, the allowed transitions and the final states.

A job only moves forward; the one way back is through ``Rescheduled``, which returns it to the
optimizer chain. The table below is the single source of truth: ``taskqueue.queues.jobs`` refuses
every change that is not in it.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    RECEIVED = "Received"
    CHECKING = "Checking"
    WAITING = "Waiting"
    MATCHED = "Matched"
    RUNNING = "Running"
    STALLED = "Stalled"
    COMPLETING = "Completing"
    DONE = "Done"
    FAILED = "Failed"
    KILLED = "Killed"
    RESCHEDULED = "Rescheduled"
    DELETED = "Deleted"


S = JobStatus

#: The minor status of a Waiting job that no configured queue can run (taskqueue.queues.unrunnable).
NO_QUEUE_MINOR_STATUS = "No configured queue can run it (see explain)"
#: ... and one that only queues without an Executor could run: the site director starts no
#: pilot for it (taskqueue.queues.unrunnable).
NO_DIRECTOR_MINOR_STATUS = ("No queue with a way to start pilots (an Executor) can run it "
                            "(see explain)")

#: Statuses a job may move to from each status.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    S.RECEIVED: frozenset({S.CHECKING, S.FAILED, S.KILLED, S.DELETED}),
    S.CHECKING: frozenset({S.WAITING, S.FAILED, S.KILLED, S.DELETED}),
    S.WAITING: frozenset({S.MATCHED, S.RESCHEDULED, S.FAILED, S.KILLED, S.DELETED}),
    S.MATCHED: frozenset({S.RUNNING, S.STALLED, S.COMPLETING, S.DONE, S.FAILED, S.KILLED,
                          S.RESCHEDULED}),
    S.RUNNING: frozenset({S.STALLED, S.COMPLETING, S.DONE, S.FAILED, S.KILLED, S.RESCHEDULED}),
    # A stalled job whose pilot speaks again resumes; otherwise it is rescheduled or failed.
    S.STALLED: frozenset({S.RUNNING, S.COMPLETING, S.DONE, S.FAILED, S.KILLED, S.RESCHEDULED}),
    S.COMPLETING: frozenset({S.DONE, S.FAILED, S.KILLED}),
    S.DONE: frozenset({S.DELETED, S.RESCHEDULED}),
    S.FAILED: frozenset({S.DELETED, S.RESCHEDULED}),
    S.KILLED: frozenset({S.DELETED, S.RESCHEDULED}),
    S.RESCHEDULED: frozenset({S.RECEIVED, S.KILLED, S.DELETED}),
    S.DELETED: frozenset(),
}

#: Statuses in which nothing more happens to a job unless someone reschedules it.
FINAL_STATES: frozenset[JobStatus] = frozenset({S.DONE, S.FAILED, S.KILLED, S.DELETED})

#: Statuses in which a job still waits for a resource (its SubmitPool must be kept).
PENDING_STATES: frozenset[JobStatus] = frozenset({S.RECEIVED, S.CHECKING, S.WAITING,
                                                  S.RESCHEDULED})


def is_allowed(current: JobStatus, new: JobStatus) -> bool:
    """Whether a job in ``current`` may move to ``new``."""
    return new in TRANSITIONS[current]
