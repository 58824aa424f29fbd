"""The schema the migrations build is exactly the schema the models describe."""

from __future__ import annotations

import uuid
from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import make_url

from gridpilot import schema
from taskqueue.database import make_engine
from taskqueue.models import Base
from tests.conftest import Database
from tests.helpers import HEAD_REVISION


def test_migrations_match_the_models(db: Database) -> None:
    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []


def test_database_is_at_head(db: Database) -> None:
    assert schema.current_revision(db.engine) == schema.head_revision(db.engine) == HEAD_REVISION


def test_revision_0016_goes_down_and_up_again(database: Database) -> None:
    """0016 drops the history's and the queue rows' keys to jobs (kept: the queue rows' key
    to their queue); going back to 0015 restores both, on a database of its own."""
    engine = _fresh_copy(database)
    try:
        assert _keys_to_jobs(engine) == set()
        config = schema.alembic_config(engine)
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0015")
        engine.dispose()
        assert _keys_to_jobs(engine) == {"job_status_history", "task_queue_jobs"}
        schema.upgrade(engine)
        engine.dispose()
        assert _keys_to_jobs(engine) == set()
        assert {fk["referred_table"] for fk in inspect(engine).get_foreign_keys(
            "task_queue_jobs")} == {"task_queues"}
    finally:
        engine.dispose()
        _drop_copy(database, engine)


def _keys_to_jobs(engine: Engine) -> set[str]:
    found = inspect(engine)
    return {table for table in ("job_status_history", "task_queue_jobs")
            for fk in found.get_foreign_keys(table) if fk["referred_table"] == "jobs"}


def _fresh_copy(database: Database) -> Engine:
    """A new, migrated database on the same server as ``database`` (SQLite: a new file)."""
    url = make_url(database.url)
    if database.backend == "sqlite":
        assert url.database is not None
        url = url.set(database=f"{url.database}.0016-{uuid.uuid4().hex[:8]}")
    else:
        name = f"gp_test_mig_{uuid.uuid4().hex[:8]}"
        admin = create_engine(url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        admin.dispose()
        url = url.set(database=name)
    engine = make_engine(url.render_as_string(hide_password=False))
    schema.upgrade(engine)
    engine.dispose()
    return engine


def _drop_copy(database: Database, engine: Engine) -> None:
    if database.backend == "sqlite":
        Path(str(engine.url.database)).unlink(missing_ok=True)
        return
    admin = create_engine(make_url(database.url), isolation_level="AUTOCOMMIT")
    force = " WITH (FORCE)" if database.backend == "postgresql" else ""
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {engine.url.database}{force}"))
    admin.dispose()
