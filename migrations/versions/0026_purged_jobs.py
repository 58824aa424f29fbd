"""The purge of ended jobs: the jobs it removed are counted per VO and final status, so that
the dashboard's job counts keep their totals.

Revision ID: 0026
Revises: 0023
Create Date: 2026-11-28 15:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "purged_jobs",
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("jobs", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("vo", "status", name=op.f("pk_purged_jobs")),
    )


def downgrade() -> None:
    op.drop_table("purged_jobs")
