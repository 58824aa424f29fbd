"""A hung database fails a transaction instead of holding it: the server cancels a statement
after ``[database] statement_timeout`` (PostgreSQL ``statement_timeout``, MariaDB
``max_statement_time``), and every engine made from the settings carries the limits."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from taskqueue.core.settings import DatabaseSettings
from taskqueue.db.database import engine_for, make_engine
from tests.conftest import Database

SLEEP = {"postgresql": "SELECT pg_sleep(30)", "mariadb": "SELECT SLEEP(30)"}


def test_a_statement_longer_than_the_limit_is_cancelled(db: Database) -> None:
    if not db.is_server:
        pytest.skip("SQLite runs in the process: there is no server to hang")
    engine = make_engine(db.url, pool_size=1, statement_timeout=1)
    try:
        with pytest.raises(OperationalError), engine.connect() as conn:
            conn.execute(text(SLEEP[db.backend])).all()
        with engine.connect() as conn:  # the next transaction works
            assert conn.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        engine.dispose()


def test_the_settings_limits_reach_the_server(db: Database) -> None:
    if not db.is_server:
        pytest.skip("SQLite has no server-side statement limit")
    engine = engine_for(DatabaseSettings(url=db.url, statement_timeout=7.5))
    try:
        with engine.connect() as conn:
            if db.backend == "postgresql":
                assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "7500ms"
            else:
                value = conn.execute(text("SELECT @@max_statement_time")).scalar_one()
                assert float(value) == 7.5
    finally:
        engine.dispose()


def test_default_limits_and_none_for_migrations(db: Database) -> None:
    if not db.is_server:
        pytest.skip("SQLite has no server-side statement limit")
    default = engine_for(DatabaseSettings(url=db.url))
    unlimited = engine_for(DatabaseSettings(url=db.url), statement_timeout=0)
    pg = db.backend == "postgresql"
    query = "SHOW statement_timeout" if pg else "SELECT @@max_statement_time"
    try:
        with default.connect() as conn:
            value = conn.execute(text(query)).scalar_one()
            assert value == "20s" if pg else float(value) == 20
        with unlimited.connect() as conn:
            value = conn.execute(text(query)).scalar_one()
            assert value == "0" if pg else float(value) == 0
    finally:
        default.dispose()
        unlimited.dispose()


@pytest.mark.parametrize("name", ["connect_timeout", "pool_timeout", "statement_timeout"])
def test_negative_timeouts_are_refused(name: str) -> None:
    from taskqueue.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=f"database.{name} must not be negative"):
        DatabaseSettings(**{name: -1.0})  # type: ignore[arg-type]
