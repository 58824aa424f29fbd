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

from agents.ce.base import ComputeElement
from agents.ce.config import ARC, CEConfig

#: How each kind is built: (config, pilot folders' parent, the agents' settings) → a CE.
Builder = Callable[[CEConfig, Path, Any], ComputeElement]


def _psij(config: CEConfig, workdir: Path, agents: Any) -> ComputeElement:
    from agents.ce.psij import PsijCE

    return PsijCE(config.executor, workdir,
                  polling_interval=max(1, min(30, agents.pilot_status_interval)))


def _arc(config: CEConfig, workdir: Path, agents: Any) -> ComputeElement:
    from agents.ce.arc import ArcCE

    return ArcCE(config, timeout=agents.ce_timeout)


KINDS: dict[str, Builder] = {"psij": _psij, ARC: _arc}


class ComputeElements:
    """The CEs of one agent process, each built once and kept (a PSI/J executor watches its
    pilots for the life of the process), and each CE's back-off after it failed."""

    def __init__(self, workdir: Path, agents: Any, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workdir = workdir
        self.agents = agents
        self.clock = clock
        self._built: dict[CEConfig, ComputeElement] = {}
        #: CE name → (failures in a row, monotonic time before which it is left alone).
        self._backoff: dict[str, tuple[int, float]] = {}

    def get(self, config: CEConfig) -> ComputeElement:
        if config not in self._built:
            self._built[config] = KINDS[config.kind](config, self.workdir, self.agents)
        return self._built[config]

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
