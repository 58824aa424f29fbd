"""What every agent loop is given: the settings, the database, the resources configuration
(read again when its file changes), the clock and a logger."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from optimizers.chain import ChainContext
from optimizers.datalocation import ReplicaCatalogue, catalogue_for
from optimizers.resources import ResourcesConfig, load_resources
from taskqueue.core.settings import Settings
from taskqueue.db.database import Session, SessionFactory, run_in_transaction

T = TypeVar("T")


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class AgentContext:
    settings: Settings
    factory: SessionFactory
    #: The pilots' token signing secret (the site director issues pilot tokens).
    secret: str = ""
    #: How /metrics judges a bearer token other than the metrics token: the matcher's own
    #: rules (matcher.service.metrics_token_judge, given by ``gridpilot agents``), None for
    #: one it admits, else the HTTP status and why not. None: that token is refused.
    metrics_judge: Callable[[str], tuple[int, str] | None] | None = None
    clock: Callable[[], datetime] = utcnow
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("agents"))
    #: Where the watchdog's walk over the waiting jobs resumes at its next turn (a job id;
    #: taskqueue.queues.unrunnable).
    unrunnable_after: int = 0
    _resources: tuple[float, ResourcesConfig] | None = None
    _catalogue: ReplicaCatalogue | None = None

    def now(self) -> datetime:
        return self.clock()

    def transaction(self, work: Callable[[Session], T]) -> T:
        return run_in_transaction(self.factory, work)

    def resources(self) -> ResourcesConfig:
        """The resources configuration, read again whenever its file changed."""
        path = Path(self.settings.resources.file)
        mtime = path.stat().st_mtime_ns if path.exists() else -1
        if self._resources is None or self._resources[0] != mtime:
            self._resources = (mtime, load_resources(path))
        return self._resources[1]

    def chain_context(self) -> ChainContext:
        if self._catalogue is None:
            self._catalogue = catalogue_for(self.settings.catalogue)
        return ChainContext(self.settings, self.resources(), self.now(), random.Random(),
                            self._catalogue)
