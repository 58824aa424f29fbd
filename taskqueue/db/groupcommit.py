"""Group commit: the calls that threads of one process make while a call of theirs is already
running go together, as one group, in the next one.

A database makes one durable commit per transaction, and a claim's commit (a flush of the
log to disk) is a fifth to a third of the claim's time on the machines measured. A matcher
process that serves many pilots at once (gunicorn's threaded workers) hands its concurrent
claims to one :class:`GroupCommit`, which runs them as groups: each group is one transaction,
so that one commit serves all its pilots, as a database's own log writer does for its
sessions.

No call ever waits for company: a thread that finds a lane free runs at once, alone. A thread
that finds every lane busy (``lanes`` groups running, each on a database connection of its
own) queues; when a group ends, its leader hands its lane to the first thread queued, which
runs everything queued by then (at most ``most`` calls) and hands on in turn. So a call waits
for the group running on its lane (and more only when over ``most`` calls queue ahead of it),
and under no load every call is a group of one. Two lanes let one process keep two database
connections (and two server cores) busy, one group running while the next one forms.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Waiter(Generic[T, R]):
    """One call: what it asks, and once its group ran, its answer or its error."""

    __slots__ = ("answer", "error", "finished", "item", "woken")

    def __init__(self, item: T) -> None:
        self.item = item
        self.woken = threading.Event()
        self.finished = False
        self.answer: R | None = None
        self.error: BaseException | None = None

    def outcome(self) -> R:
        if self.error is not None:
            raise self.error
        return self.answer  # type: ignore[return-value]  # set with finished


class GroupCommit(Generic[T, R]):
    """Runs ``run`` on groups of the items that :meth:`call` is given by concurrent threads.

    ``run(items)`` answers each item in order: its answer, or an exception for that item
    alone (raised to its caller). An exception that ``run`` itself raises goes to every
    caller of the group. Thread-safe; one per process (after a fork, make a new one)."""

    def __init__(self, run: Callable[[Sequence[T]], Sequence[R | BaseException]],
                 most: int = 8, lanes: int = 1) -> None:
        if most < 1:
            raise ValueError(f"a group holds at least one call, not {most}")
        if lanes < 1:
            raise ValueError(f"groups need at least one lane, not {lanes}")
        self._run = run
        self.most = most
        self.lanes = lanes
        self._lock = threading.Lock()
        self._queued: list[_Waiter[T, R]] = []
        self._running = 0  # lanes held by a leader
        #: Groups run and calls answered so far (the benchmarks report them).
        self.groups = 0
        self.calls = 0

    @property
    def queued(self) -> int:
        """How many calls wait for a lane."""
        with self._lock:
            return len(self._queued)

    @property
    def running(self) -> int:
        """How many lanes a group holds (or is about to)."""
        with self._lock:
            return self._running

    def call(self, item: T) -> R:
        """Run ``item`` in the next group (at once when a lane is free) and answer it."""
        me: _Waiter[T, R] = _Waiter(item)
        with self._lock:
            lead = self._running < self.lanes
            if lead:
                self._running += 1
            else:
                self._queued.append(me)
        if not lead:
            me.woken.wait()
            if me.finished:
                return me.outcome()
            # Woken unfinished: handed a lane (and taken off the queue by the one who did).
        with self._lock:
            group = [me, *self._queued[:self.most - 1]]
            del self._queued[:self.most - 1]
        try:
            self._answer(group)
        finally:
            with self._lock:
                if self._queued:  # the lane goes to the first queued, who leads the next
                    self._queued.pop(0).woken.set()
                else:
                    self._running -= 1
            for waiter in group:
                if waiter is not me:
                    waiter.woken.set()
        return me.outcome()

    def _answer(self, group: list[_Waiter[T, R]]) -> None:
        try:
            outcomes = self._run([waiter.item for waiter in group])
            if len(outcomes) != len(group):
                raise RuntimeError(f"a group of {len(group)} calls got {len(outcomes)} "
                                   "answers")
            for waiter, outcome in zip(group, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    waiter.error = outcome
                else:
                    waiter.answer = outcome
        except BaseException as exc:  # every caller's, the leader's included (it raises it)
            for waiter in group:
                waiter.error = exc
        finally:
            for waiter in group:
                waiter.finished = True
            with self._lock:
                self.groups += 1
                self.calls += len(group)
