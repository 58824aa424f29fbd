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
from collections.abc import Callable


class TurnBudget:
    """Seconds a CE's requests may take in all in one turn; threads may share one."""

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self._spent = 0.0
        self._lock = threading.Lock()

    def start_turn(self) -> None:
        """A new turn: the CE has all its seconds again."""
        with self._lock:
            self._spent = 0.0

    def left(self) -> float:
        """Seconds left for this turn (0 or less: spent)."""
        with self._lock:
            return self.seconds - self._spent

    def spend(self, seconds: float) -> None:
        with self._lock:
            self._spent += seconds

    def over(self) -> bool:
        return self.left() <= 0
