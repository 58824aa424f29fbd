"""What one matcher process holds: its settings, its database engine and the resources
configuration. Nothing here must agree between processes; all shared state is in the
database."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from flask import Flask

from matcher.idp import IdentityProviders
from matcher.metrics import Metrics
from optimizers.chain import ChainContext
from optimizers.datalocation import ReplicaCatalogue, catalogue_for
from optimizers.queuework import QueueWork
from optimizers.resources import ResourcesConfig, load_resources
from taskqueue.core.settings import Settings
from taskqueue.db.database import (
    Session,
    SessionFactory,
    engine_for,
    make_session_factory,
    run_in_transaction,
)
from taskqueue.db.health import HealthProbe
from taskqueue.files.sandboxstore import SandboxStore, open_store
from taskqueue.pilots.pilotmatch import MatchDatabase, open_match_database
from taskqueue.signingkeys import KeyCache

T = TypeVar("T")
EXTENSION = "gridpilot"


@dataclass
class Runtime:
    settings: Settings
    secret: str
    metrics: Metrics
    #: Identity providers whose tokens are accepted (their keys are cached per process).
    providers: IdentityProviders = field(default_factory=lambda: IdentityProviders(()))
    _pid: int = -1
    _factory: SessionFactory | None = None
    _match_db: tuple[int, MatchDatabase] | None = None
    _resources: tuple[float, ResourcesConfig] | None = None
    _health: tuple[int, HealthProbe] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _store: SandboxStore | None = None
    _catalogue: ReplicaCatalogue | None = None
    #: The process's random draws (queue keys), seeded afresh in each forked worker.
    _rng: tuple[int, random.Random] | None = None
    #: Whether work each queue could run is waiting, as last found (optimizers.queuework).
    queue_work: QueueWork = field(default_factory=QueueWork)
    #: The key the process signs payloads' tokens with, as last read (matcher.payloadtokens).
    signing_keys: KeyCache = field(default_factory=KeyCache)

    def sandbox_store(self) -> SandboxStore:
        """Where sandbox bytes are kept ([sandboxes] settings), opened on first use."""
        if self._store is None:
            self._store = open_store(self.settings)
        return self._store

    def session_factory(self) -> SessionFactory:
        """The process's session factory, made on first use (after any fork)."""
        if self._factory is None or self._pid != os.getpid():
            with self._lock:
                if self._factory is None or self._pid != os.getpid():
                    engine = engine_for(self.settings.database, liveness=self.database_answers)
                    self._factory = make_session_factory(engine)
                    self._pid = os.getpid()
        return self._factory

    def match_database(self) -> MatchDatabase:
        """Where this process's matches run (taskqueue.pilots.pilotmatch): its sessions, and on a
        database with a claim function an engine in autocommit for it."""
        cached = self._match_db
        if cached is None or cached[0] != os.getpid():
            sessions = self.session_factory()
            with self._lock:
                cached = (os.getpid(), open_match_database(
                    self.settings.database, sessions, liveness=self.database_answers))
                self._match_db = cached
        return cached[1]

    def health(self) -> HealthProbe:
        """The process's database health check (taskqueue.db.health)."""
        with self._lock:
            if self._health is None or self._health[0] != os.getpid():
                self._health = (os.getpid(), HealthProbe(self.settings.database))
            return self._health[1]

    def database_answers(self) -> bool:
        """Whether the database answers the health check: asked about a request's statement
        that runs long, which is given up when it does not (taskqueue.db.statementdeadline)."""
        return self.health().check() is None

    def dispose(self) -> None:
        """Close this process's database connections (tests; a server process just exits)."""
        if self._factory is not None:
            bind = self._factory.kw.get("bind")
            if bind is not None:
                bind.dispose()
            self._factory = None
        if self._match_db is not None:
            if self._match_db[1].autocommit is not None:
                self._match_db[1].autocommit.dispose()
            self._match_db = None
        if self._health is not None:
            self._health[1].dispose()
            self._health = None

    def transaction(self, work: Callable[[Session], T]) -> T:
        """Run ``work`` in one transaction, retried on a deadlock or serialisation failure."""
        return run_in_transaction(self.session_factory(), work)

    def resources(self) -> ResourcesConfig:
        """The resources configuration, read again when its file changes."""
        path = Path(self.settings.resources.file)
        mtime = path.stat().st_mtime if path.exists() else -1.0
        cached = self._resources
        if cached is None or cached[0] != mtime:
            cached = (mtime, load_resources(path))
            self._resources = cached
        return cached[1]

    def chain_context(self, now: datetime) -> ChainContext:
        return ChainContext(self.settings, self.resources(), now, self.random(),
                            self.catalogue())

    def catalogue(self) -> ReplicaCatalogue:
        """Where replicas are looked up ([catalogue] settings), made on first use."""
        if self._catalogue is None:
            self._catalogue = catalogue_for(self.settings.catalogue)
        return self._catalogue

    def random(self) -> random.Random:
        """The process's random generator (the chain's draws, the matcher's draw of task
        queues), seeded from the OS once per process: seeding a new one per request costs
        more than the rest of a small request, drawing from the OS (SystemRandom) costs a
        system call per number, and a worker forked with its parent's generator would repeat
        its draws."""
        pid = os.getpid()
        cached = self._rng
        if cached is None or cached[0] != pid:
            cached = (pid, random.Random())
            self._rng = cached
        return cached[1]


def runtime_of(app: Flask) -> Runtime:
    runtime = app.extensions[EXTENSION]
    assert isinstance(runtime, Runtime)
    return runtime
