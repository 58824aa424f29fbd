"""The schema the migrations build is exactly the schema the models describe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect

from gridpilot import schema
from taskqueue.db.database import make_engine
from taskqueue.db.models import Base
from tests.conftest import Database, _server_database
from tests.helpers import HEAD_REVISION


def test_migrations_match_the_models(db: Database) -> None:
    def here(obj: Any, _name: Any, kind: str, _reflected: bool, _other: Any) -> bool:
        """Leave out an index the models give only some databases (info "dialects")."""
        dialects = getattr(obj, "info", {}).get("dialects") if kind == "index" else None
        return dialects is None or db.engine.dialect.name in dialects

    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True,
                                                     "include_object": here})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []
    indexes = {str(i["name"]) for i in inspect(db.engine).get_indexes("jobs")}
    assert ("ix_jobs_unrunnable" in indexes) == (db.backend in ("postgresql", "sqlite"))


def test_database_is_at_head(db: Database) -> None:
    assert schema.current_revision(db.engine) == schema.head_revision(db.engine) == HEAD_REVISION


def test_revision_0016_goes_down_and_up_again(database: Database, tmp_path: Path) -> None:
    """0016 drops the history's and the queue rows' keys to jobs (kept: the queue rows' key
    to their queue); going back to 0015 restores both, on a database of its own."""
    urls = (iter([f"sqlite:///{tmp_path / 'gridpilot.db'}"]) if database.backend == "sqlite"
            else _server_database(database.backend))
    engine = make_engine(next(urls))
    try:
        schema.upgrade(engine)
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
        next(urls, None)  # drops a server's database


def _keys_to_jobs(engine: Engine) -> set[str]:
    found = inspect(engine)
    return {table for table in ("job_status_history", "task_queue_jobs")
            for fk in found.get_foreign_keys(table) if fk["referred_table"] == "jobs"}


def test_revision_0020_goes_down_and_up_again(database: Database, tmp_path: Path) -> None:
    """0020 adds the replica catalogue; going back to 0016 drops it, and up again restores
    it empty, on a database of its own."""
    urls = (iter([f"sqlite:///{tmp_path / 'gridpilot.db'}"]) if database.backend == "sqlite"
            else _server_database(database.backend))
    engine = make_engine(next(urls))
    try:
        schema.upgrade(engine)
        assert "file_replicas" in inspect(engine).get_table_names()
        config = schema.alembic_config(engine)
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0016")
        engine.dispose()
        assert "file_replicas" not in inspect(engine).get_table_names()
        assert schema.current_revision(engine) == "0016"
        schema.upgrade(engine)
        engine.dispose()
        found = inspect(engine)
        assert "file_replicas" in found.get_table_names()
        assert [ix["column_names"] for ix in found.get_indexes("file_replicas")] == [
            ["vo", "se"]]
    finally:
        engine.dispose()
        next(urls, None)  # drops a server's database


def test_revision_0023_goes_down_and_up_again(database: Database, tmp_path: Path) -> None:
    """0023 indexes the pilots by updated_at; back at 0016 the index is gone, and an index
    an operator made beforehand (CREATE INDEX CONCURRENTLY on a live database) is taken as
    it is, on a database of its own."""
    urls = (iter([f"sqlite:///{tmp_path / 'gridpilot.db'}"]) if database.backend == "sqlite"
            else _server_database(database.backend))
    engine = make_engine(next(urls))
    try:
        schema.upgrade(engine)
        assert "ix_pilots_updated_at" in _pilot_indexes(engine)
        config = schema.alembic_config(engine)
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0016")
        engine.dispose()
        assert "ix_pilots_updated_at" not in _pilot_indexes(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE INDEX ix_pilots_updated_at ON pilots (updated_at)")
        schema.upgrade(engine)
        engine.dispose()
        assert schema.current_revision(engine) == HEAD_REVISION
        assert "ix_pilots_updated_at" in _pilot_indexes(engine)
    finally:
        engine.dispose()
        next(urls, None)  # drops a server's database


def _pilot_indexes(engine: Engine) -> set[str]:
    return {str(index["name"]) for index in inspect(engine).get_indexes("pilots")}
