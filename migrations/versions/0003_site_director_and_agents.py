"""The site director's pilot records (executor, native id, reason) and queue state, and the
agents' run records.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 13:29:54.743249
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

import taskqueue.db.models

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


#: Timestamp columns of the earlier revisions: MariaDB stored them as DATETIME, whole seconds.
_TIMESTAMPS = {
    "group_shares": [("updated_at", False)],
    "pilots": [("submitted_at", False), ("last_seen_at", True)],
    "site_bans": [("banned_at", False)],
    "site_limits": [("last_matched_at", True), ("updated_at", False)],
    "submit_pools": [("created_at", False), ("updated_at", False)],
    "jobs": [
        ("submitted_at", False),
        ("started_at", True),
        ("ended_at", True),
        ("heartbeat_at", True),
    ],
    "submit_pool_queues": [("refreshed_at", False)],
    "task_queues": [("created_at", False), ("emptied_at", True)],
    "job_status_history": [("at", False)],
}


def upgrade() -> None:
    if op.get_bind().dialect.name == "mysql":
        for table, columns in _TIMESTAMPS.items():
            for column, nullable in columns:
                op.alter_column(
                    table,
                    column,
                    existing_type=mysql.DATETIME(),
                    type_=mysql.DATETIME(fsp=6),
                    existing_nullable=nullable,
                )
    op.create_table(
        "agent_runs",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("started_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.Column("finished_at", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.Column("holder", sa.String(length=255), nullable=False),
        sa.Column("summary", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_agent_runs")),
    )
    op.create_table(
        "director_queues",
        sa.Column("site", sa.String(length=128), nullable=False),
        sa.Column("ce", sa.String(length=255), nullable=False),
        sa.Column("queue", sa.String(length=128), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("skip_until", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.Column("last_error", sa.String(length=255), nullable=False),
        sa.Column("last_cycle_at", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("site", "ce", "queue", name=op.f("pk_director_queues")),
    )
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.add_column(sa.Column("executor", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("native_id", sa.String(length=255), nullable=True))
        batch_op.add_column(
            sa.Column("reason", sa.String(length=255), nullable=False, server_default="")
        )
        batch_op.add_column(sa.Column("updated_at", taskqueue.db.models.UTCDateTime(),
                                      nullable=True))
        batch_op.create_index(
            batch_op.f("ix_pilots_status_executor"), ["status", "executor"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pilots_status_executor"))
        batch_op.drop_column("updated_at")
        batch_op.drop_column("reason")
        batch_op.drop_column("native_id")
        batch_op.drop_column("executor")

    op.drop_table("director_queues")
    op.drop_table("agent_runs")
