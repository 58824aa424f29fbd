"""The compute elements an agent process keeps, one per configuration (agents.ce.config),
each built by its kind.

Kinds are registered in ``KINDS``; a new kind (HTCondor-CE) is a module with a class that
implements agents.ce.base.ComputeElement and a line there: the director does not change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.ce.base import HELD, QUEUED, STAGE, ComputeElement
from agents.ce.budget import TurnBudget
from agents.ce.config import ARC, CEConfig

#: How each kind is built: (config, pilot folders' parent, the agents' settings, the CE's
#: time for one turn) → a CE.
Builder = Callable[[CEConfig, Path, Any, TurnBudget], ComputeElement]


def _psij(config: CEConfig, workdir: Path, agents: Any, budget: TurnBudget) -> ComputeElement:
    from agents.ce.psij import PsijCE

    return PsijCE(config.executor, workdir,
                  polling_interval=max(1, min(30, agents.pilot_status_interval)))


def _arc(config: CEConfig, workdir: Path, agents: Any, budget: TurnBudget) -> ComputeElement:
    from agents.ce.arc import ArcCE

    return ArcCE(config, timeout=agents.ce_timeout, budget=budget)


KINDS: dict[str, Builder] = {"psij": _psij, ARC: _arc}


def state_timeouts(config: CEConfig, agents: Any) -> dict[str, int]:
    """The seconds a pilot may stay in each state of the CE's kind before it is killed
    (0: never): ``[agents] pilot_stage_timeout``, ``pilot_held_timeout`` and
    ``pilot_queued_timeout`` by the kind of wait each state is (agents.ce.base)."""
    if config.kind == ARC:
        from agents.ce.arcrest import WAITING_KINDS
    else:
        from agents.ce.psij import WAITING_KINDS
    seconds = {STAGE: agents.pilot_stage_timeout, HELD: agents.pilot_held_timeout,
               QUEUED: agents.pilot_queued_timeout}
    return {state: int(seconds[kind]) for state, kind in WAITING_KINDS.items()}


class ComputeElements:
    """The CEs of one agent process, each built once and kept (a PSI/J executor watches its
    pilots for the life of the process), each CE's back-off after it failed, and the time
    each CE may take in one turn of a loop (``[agents] ce_turn_budget``; a loop calls
    :meth:`start_turn` first)."""

    def __init__(self, workdir: Path, agents: Any, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workdir = workdir
        self.agents = agents
        self.clock = clock
        self._built: dict[CEConfig, ComputeElement] = {}
        #: CE name → (failures in a row, monotonic time before which it is left alone).
        self._backoff: dict[str, tuple[int, float]] = {}
        #: CE name → its time in this turn.
        self._budgets: dict[str, TurnBudget] = {}

    def get(self, config: CEConfig) -> ComputeElement:
        if config not in self._built:
            self._built[config] = KINDS[config.kind](config, self.workdir, self.agents,
                                                     self.budget(config))
        return self._built[config]

    def budget(self, config: CEConfig) -> TurnBudget:
        """The CE's time for one turn, shared by the configurations that name one CE."""
        if config.name not in self._budgets:
            self._budgets[config.name] = TurnBudget(self.agents.ce_turn_budget)
        return self._budgets[config.name]

    def start_turn(self) -> None:
        """A loop's turn begins: every CE has its whole budget again."""
        for budget in self._budgets.values():
            budget.start_turn()

    def turn_over(self, config: CEConfig) -> bool:
        """Whether the CE used its time for this turn."""
        budget = self._budgets.get(config.name)
        return budget is not None and budget.over()

    def resting(self, config: CEConfig) -> bool:
        """Whether the CE failed lately and is left alone for now."""
        entry = self._backoff.get(config.name)
        return entry is not None and self.clock() < entry[1]

    def failed(self, config: CEConfig) -> int:
        """Note a failure of the CE: it is left alone for ``failure_backoff`` seconds,
        doubling per failure in a row (at most 16 times); returns the failures in a row."""
        failures = self._backoff.get(config.name, (0, 0.0))[0] + 1
        pause = self.agents.failure_backoff * min(16, 2 ** (failures - 1))
        self._backoff[config.name] = (failures, self.clock() + pause)
        return failures

    def answered(self, config: CEConfig) -> None:
        self._backoff.pop(config.name, None)
