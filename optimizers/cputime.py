"""The CPU time one thread spends on a piece of work, for the budgets that stop expensive work
a user's text asks for (a JDL's evaluation, a Requirements expression's).

A wall clock would count what a loaded machine makes the thread wait (for a core, for the GIL)
and so refuse a plain description, or give up an expression for good, only because the
machine was busy. The thread's own CPU time (``time.thread_time``, a system call) is read only
once the wall clock (cheap) says the budget may be spent: CPU time never runs ahead of it.
"""

from __future__ import annotations

import time


class Stopwatch:
    """Started when made; :meth:`over` says whether the thread has spent more than a budget
    of CPU time since."""

    __slots__ = ("_cpu", "_wall")

    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()

    def over(self, seconds: float) -> float | None:
        """The CPU seconds spent since the start if they are more than ``seconds``, else
        None."""
        if time.perf_counter() - self._wall <= seconds:
            return None
        spent = time.thread_time() - self._cpu
        return spent if spent > seconds else None
