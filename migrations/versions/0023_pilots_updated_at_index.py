"""Pilots are indexed by the time of their last status change, so that the pilots that ended
in the last hour per site (the agents' metrics, read at every Prometheus scrape) are found
without reading every pilot ever recorded.

Creating the index holds off writes to ``pilots`` while it is built (about a second per
million pilots on PostgreSQL). On a large live database, create it beforehand without that
lock, and this revision finds it there:
``CREATE INDEX CONCURRENTLY ix_pilots_updated_at ON pilots (updated_at)``.

Revision ID: 0023
Revises: 0020
Create Date: 2026-11-28 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(op.f("ix_pilots_updated_at"), "pilots", ["updated_at"], unique=False,
                    if_not_exists=True)


def downgrade() -> None:
    op.drop_index(op.f("ix_pilots_updated_at"), table_name="pilots")
