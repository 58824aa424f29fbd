"""One lock row per sandbox uploader, so that parallel uploads of one owner have their quota
checked one after the other; and the dashboard sessions signed out before their cookies expire.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-28 15:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sandbox_quota_locks",
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("vo", "owner", name=op.f("pk_sandbox_quota_locks")),
    )
    op.create_table(
        "dashboard_sign_outs",
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("expires_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_dashboard_sign_outs")),
    )
    op.create_index(op.f("ix_dashboard_sign_outs_expires_at"), "dashboard_sign_outs",
                    ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_dashboard_sign_outs_expires_at"), table_name="dashboard_sign_outs")
    op.drop_table("dashboard_sign_outs")
    op.drop_table("sandbox_quota_locks")
