"""The dashboard's history: jobs matched, done and failed per site and period, snapshots of
the jobs per status and of each queue's state, and the index on the job status history the
activity loop reads by.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 21:53:09.958592
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_counts",
        sa.Column("period", sa.Integer(), nullable=False),
        sa.Column("at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("dimension", sa.String(length=16), nullable=False),
        sa.Column("value", sa.String(length=128), nullable=False),
        sa.Column("jobs", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("period", "at", "vo", "dimension", "value",
                                name=op.f("pk_job_counts")),
    )
    op.create_table(
        "site_activity",
        sa.Column("period", sa.Integer(), nullable=False),
        sa.Column("start", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("site", sa.String(length=128), nullable=False),
        sa.Column("matched", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("period", "start", "vo", "site", name=op.f("pk_site_activity")),
    )
    op.create_table(
        "queue_status",
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("site", sa.String(length=128), nullable=False),
        sa.Column("ce", sa.String(length=255), nullable=False),
        sa.Column("queue", sa.String(length=128), nullable=False),
        sa.Column("at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.Column("configured", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("waiting_for", sa.Integer(), nullable=True),
        sa.Column("task_queues", sa.Integer(), nullable=True),
        sa.Column("pilots", sa.Text(), nullable=False),
        sa.Column("last_pilot_seen", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("vo", "site", "ce", "queue", name=op.f("pk_queue_status")),
    )
    with op.batch_alter_table("job_status_history", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_status_history_status_at"), ["status", "at"],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_status_history", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_status_history_status_at"))
    op.drop_table("queue_status")
    op.drop_table("site_activity")
    op.drop_table("job_counts")
