"""Shared fixtures: a database per backend, its schema built by the migrations.

SQLite always runs. PostgreSQL and MariaDB run when GRIDPILOT_TEST_POSTGRES_URL and
GRIDPILOT_TEST_MARIADB_URL name a server (any database on it: each test session creates its own
database there and drops it at the end). With GRIDPILOT_TEST_REQUIRE_SERVERS=1 (as in CI) a
missing or unreachable server is an error, never a silent skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from gridpilot import schema
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine, make_session_factory
from taskqueue.db.models import Base
from taskqueue.pilots.pilotmatch import MatchDatabase
from tests import helpers

SERVER_ENV = {"postgresql": "GRIDPILOT_TEST_POSTGRES_URL", "mariadb": "GRIDPILOT_TEST_MARIADB_URL"}


def _backends() -> list[str]:
    found = ["sqlite"]
    for name, env in SERVER_ENV.items():
        if os.environ.get(env):
            found.append(name)
        elif os.environ.get("GRIDPILOT_TEST_REQUIRE_SERVERS") == "1":
            raise pytest.UsageError(f"{env} is not set but GRIDPILOT_TEST_REQUIRE_SERVERS=1")
    return found


BACKENDS = _backends()


@dataclass(frozen=True)
class Database:
    backend: str
    url: str
    engine: Engine
    factory: sessionmaker[Session]
    #: Where taskqueue.pilots.pilotmatch runs a match (the claim function's autocommit engine on a
    #: server).
    matches: MatchDatabase

    @property
    def is_server(self) -> bool:
        return self.backend != "sqlite"


def _server_database(backend: str) -> Iterator[str]:
    base = make_url(os.environ[SERVER_ENV[backend]])
    name = f"gp_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
    except Exception as exc:  # a server named in the environment must answer
        pytest.fail(f"cannot create a test database on {backend} at "
                    f"{base.render_as_string(hide_password=True)}: {exc}")
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            force = " WITH (FORCE)" if backend == "postgresql" else ""
            conn.execute(text(f"DROP DATABASE IF EXISTS {name}{force}"))
        admin.dispose()


@pytest.fixture(scope="session", params=BACKENDS)
def database(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Database]:
    """One migrated database per backend for the whole test session."""
    backend: str = request.param
    if backend == "sqlite":
        urls: Iterator[str] = iter(
            [f"sqlite:///{tmp_path_factory.mktemp('db') / 'gridpilot.db'}"])
    else:
        urls = _server_database(backend)
    url = next(urls)
    engine = make_engine(url, pool_size=4)
    schema.upgrade(engine)
    factory = make_session_factory(engine)
    autocommit = make_engine(url, pool_size=2, autocommit=True) if backend != "sqlite" else None
    try:
        yield Database(backend, url, engine, factory, MatchDatabase(factory, autocommit))
    finally:
        if autocommit is not None:
            autocommit.dispose()
        engine.dispose()
        next(urls, None)


#: How the matching tests claim: taskqueue.matching.claim.claim_jobs in the test's transaction, or
#: the matcher's entry point taskqueue.pilots.pilotmatch.match_for_pilot (on PostgreSQL and MariaDB,
#: the database's claim function) after the test's earlier transactions committed.
CLAIM_ENTRIES = ("claim_jobs", "match_for_pilot")


@pytest.fixture(params=CLAIM_ENTRIES)
def claim_entry(request: pytest.FixtureRequest, database: Database) -> Iterator[str]:
    """Run a test once per claim entry point (use it with ``pytestmark`` and
    tests.helpers.claim)."""
    helpers.CLAIM_VIA = (request.param, database.matches)
    try:
        yield request.param
    finally:
        helpers.CLAIM_VIA = None


@pytest.fixture()
def db(database: Database) -> Iterator[Database]:
    """The backend's database, emptied after each test."""
    yield database
    with database.engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())


@pytest.fixture()
def settings(database: Database) -> Settings:
    base = Settings()
    return replace(base, database=replace(base.database, url=database.url))


@pytest.fixture()
def now() -> datetime:
    return datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture()
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3 endpoint on loopback: moto's standalone server, one per test session."""
    import socket
    import subprocess
    import sys
    import time

    import requests

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("wb")
    server = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"moto_server exited; see {log.name}"
            try:
                requests.get(url, timeout=2)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, f"moto_server did not start; see {log.name}"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(params=["local", "s3"])
def sandbox_settings(request: pytest.FixtureRequest, settings: Settings,
                     tmp_path: Path) -> Settings:
    """The test's settings with each sandbox store: a local folder of its own, or a bucket of
    its own on the moto server."""
    from taskqueue.files.sandboxstore import S3Store

    if request.param == "local":
        return replace(settings, sandboxes=replace(
            settings.sandboxes, backend="local", directory=str(tmp_path / "sandboxes")))
    endpoint = request.getfixturevalue("moto_endpoint")
    chosen = replace(settings, sandboxes=replace(
        settings.sandboxes, backend="s3", endpoint_url=endpoint,
        bucket=f"sandboxes-{uuid.uuid4().hex[:12]}"))
    S3Store(chosen.sandboxes).ensure_bucket()
    return chosen
