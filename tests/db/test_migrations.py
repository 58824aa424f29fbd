"""The schema the migrations build is exactly the schema the models describe."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gridpilot import schema
from taskqueue.models import Base
from tests.conftest import Database


def test_migrations_match_the_models(db: Database) -> None:
    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []


def test_database_is_at_head(db: Database) -> None:
    assert schema.current_revision(db.engine) == schema.head_revision(db.engine) == "0010"
