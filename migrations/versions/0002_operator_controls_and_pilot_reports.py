"""Operator controls (site mask, site limits, group shares) and what pilots report on jobs
(CE, CPU used, progress, exit code, output tail).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 12:54:21.307006
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "group_shares",
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("owner_group", sa.String(length=128), nullable=False),
        sa.Column("share", sa.Float(), nullable=False),
        sa.Column("updated_by", sa.String(length=255), nullable=False),
        sa.Column("updated_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("vo", "owner_group", name=op.f("pk_group_shares")),
    )
    op.create_table(
        "site_bans",
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("site", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.String(length=255), nullable=False),
        sa.Column("banned_by", sa.String(length=255), nullable=False),
        sa.Column("banned_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("vo", "site", name=op.f("pk_site_bans")),
    )
    op.create_table(
        "site_limits",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("site", sa.String(length=128), nullable=False),
        sa.Column("ce", sa.String(length=255), nullable=False),
        sa.Column("attribute", sa.String(length=32), nullable=False),
        sa.Column("value", sa.String(length=128), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("matching_delay", sa.Integer(), nullable=True),
        sa.Column("last_matched_at", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.Column("updated_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_site_limits")),
        sa.UniqueConstraint(
            "vo",
            "site",
            "ce",
            "attribute",
            "value",
            name=op.f("uq_site_limits_vo_site_ce_attribute_value"),
        ),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ce", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("cpu_used", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("progress", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("exit_code", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("output_tail", sa.Text(), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_jobs_pilot_reference"), ["pilot_reference"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_jobs_site_status_ce"), ["site", "status", "ce"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_site_status_ce"))
        batch_op.drop_index(batch_op.f("ix_jobs_pilot_reference"))
        batch_op.drop_column("output_tail")
        batch_op.drop_column("exit_code")
        batch_op.drop_column("progress")
        batch_op.drop_column("cpu_used")
        batch_op.drop_column("ce")

    op.drop_table("site_limits")
    op.drop_table("site_bans")
    op.drop_table("group_shares")
