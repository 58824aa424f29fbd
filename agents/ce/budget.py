"""The time one CE may take in one turn of a loop (issue 33 item 4).

Each exchange with an ARC-CE ends within ``[agents] ce_timeout``, but a CE answering every
request just under that deadline would still hold a turn for one deadline per request: the
director's uploads of ten pilots, the pilots loop's logs of a hundred ended pilots. The loops
serve the CEs one after the other, so the CEs served after it would wait all that time. A
``TurnBudget`` counts the seconds a CE's requests took since the turn began
(``[agents] ce_turn_budget`` at most): each request may take no longer than what is left,
and once it is spent the CE is asked nothing more until the next turn, whose work picks up
what was left (pilots not yet submitted are decided again, logs not yet kept are fetched
then).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class TurnBudget:
    """Seconds a CE may hold one turn; threads may share one. What counts is the time during
    which at least one request to the CE is under way: requests made side by side (the outputs
    of several ended pilots) take the time of one, not the sum of theirs."""

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self._spent = 0.0
        self._under_way = 0
        self._busy_since = 0.0
        self._lock = threading.Lock()

    def start_turn(self) -> None:
        """A new turn: the CE has all its seconds again."""
        with self._lock:
            self._spent = 0.0
            self._busy_since = self.clock()

    def left(self) -> float:
        """Seconds left for this turn (0 or less: spent)."""
        with self._lock:
            busy = self.clock() - self._busy_since if self._under_way else 0.0
            return self.seconds - self._spent - busy

    @contextmanager
    def request(self) -> Iterator[None]:
        """Count a request's time against the turn, once however many run beside it."""
        with self._lock:
            if self._under_way == 0:
                self._busy_since = self.clock()
            self._under_way += 1
        try:
            yield
        finally:
            with self._lock:
                self._under_way -= 1
                if self._under_way == 0:
                    self._spent += self.clock() - self._busy_since

    def over(self) -> bool:
        return self.left() <= 0
