"""Initial schema: jobs and their history, task queues, SubmitPools and pilots.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-22 10:07:54.184992
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pilots",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("reference", sa.String(length=255), nullable=False),
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("site", sa.String(length=128), nullable=False),
        sa.Column("ce", sa.String(length=255), nullable=False),
        sa.Column("queue", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("submitted_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.Column("last_seen_at", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pilots")),
        sa.UniqueConstraint("reference", name=op.f("uq_pilots_reference")),
    )
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_pilots_site_ce_queue_status"),
            ["site", "ce", "queue", "status"],
            unique=False,
        )

    op.create_table(
        "submit_pools",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("requirements", sa.Text(), nullable=False),
        sa.Column("created_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.Column("updated_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_submit_pools")),
    )
    op.create_table(
        "jobs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("owner_group", sa.String(length=128), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("minor_status", sa.String(length=255), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("description_format", sa.String(length=8), nullable=False),
        sa.Column("bulk_index", sa.Integer(), nullable=True),
        sa.Column("job_type", sa.String(length=64), nullable=False),
        sa.Column("user_priority", sa.Integer(), nullable=False),
        sa.Column("cpu_time", sa.BigInteger(), nullable=False),
        sa.Column("processors", sa.Integer(), nullable=False),
        sa.Column("memory", sa.Integer(), nullable=False),
        sa.Column("submit_pool", sa.String(length=64), nullable=True),
        sa.Column("site", sa.String(length=128), nullable=True),
        sa.Column("pilot_reference", sa.String(length=255), nullable=True),
        sa.Column("submitted_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.Column("started_at", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.Column("ended_at", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.Column("heartbeat_at", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.Column("reschedule_count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["submit_pool"],
            ["submit_pools.id"],
            name=op.f("fk_jobs_submit_pool_submit_pools"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_owner_status"), ["owner", "status"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_status_id"), ["status", "id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_jobs_submit_pool_status"), ["submit_pool", "status"], unique=False
        )

    op.create_table(
        "submit_pool_queues",
        sa.Column("pool_id", sa.String(length=64), nullable=False),
        sa.Column("site", sa.String(length=128), nullable=False),
        sa.Column("ce", sa.String(length=255), nullable=False),
        sa.Column("queue", sa.String(length=128), nullable=False),
        sa.Column("refreshed_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pool_id"],
            ["submit_pools.id"],
            name=op.f("fk_submit_pool_queues_pool_id_submit_pools"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "pool_id", "site", "ce", "queue", name=op.f("pk_submit_pool_queues")
        ),
    )
    with op.batch_alter_table("submit_pool_queues", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_submit_pool_queues_site_ce_queue"), ["site", "ce", "queue"], unique=False
        )

    op.create_table(
        "task_queues",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("owner_group", sa.String(length=128), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=True),
        sa.Column("cpu_time", sa.BigInteger(), nullable=False),
        sa.Column("processors", sa.Integer(), nullable=False),
        sa.Column("memory", sa.Integer(), nullable=False),
        sa.Column("job_type", sa.String(length=64), nullable=False),
        sa.Column("submit_pool", sa.String(length=64), nullable=True),
        sa.Column("expression", sa.Text(), nullable=True),
        sa.Column("priority", sa.Float(), nullable=False),
        sa.Column("mean_job_priority", sa.Float(), nullable=False),
        sa.Column("jobs_inserted", sa.BigInteger(), nullable=False),
        sa.Column("active", sa.Integer(), nullable=False),
        sa.Column("draw_key", sa.Float(), nullable=False),
        sa.Column("created_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.Column("emptied_at", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["submit_pool"],
            ["submit_pools.id"],
            name=op.f("fk_task_queues_submit_pool_submit_pools"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_queues")),
        sa.UniqueConstraint("digest", name=op.f("uq_task_queues_digest")),
    )
    with op.batch_alter_table("task_queues", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_task_queues_active_vo_draw_key_id"),
            ["active", "vo", "draw_key", "id"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_task_queues_owner_group_owner"), ["owner_group", "owner"], unique=False
        )

    op.create_table(
        "job_status_history",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("minor_status", sa.String(length=255), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_job_status_history_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_status_history")),
    )
    with op.batch_alter_table("job_status_history", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_status_history_job_id"), ["job_id"], unique=False)

    op.create_table(
        "task_queue_jobs",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("tq_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_task_queue_jobs_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["tq_id"],
            ["task_queues.id"],
            name=op.f("fk_task_queue_jobs_tq_id_task_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_task_queue_jobs")),
    )
    with op.batch_alter_table("task_queue_jobs", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_task_queue_jobs_tq_id_rank_job_id"),
            ["tq_id", "rank", "job_id"],
            unique=False,
        )

    op.create_table(
        "tq_banned_sites",
        sa.Column("tq_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("value", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["tq_id"],
            ["task_queues.id"],
            name=op.f("fk_tq_banned_sites_tq_id_task_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tq_id", "value", name=op.f("pk_tq_banned_sites")),
    )
    op.create_table(
        "tq_platforms",
        sa.Column("tq_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("value", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["tq_id"],
            ["task_queues.id"],
            name=op.f("fk_tq_platforms_tq_id_task_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tq_id", "value", name=op.f("pk_tq_platforms")),
    )
    op.create_table(
        "tq_sites",
        sa.Column("tq_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("value", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["tq_id"],
            ["task_queues.id"],
            name=op.f("fk_tq_sites_tq_id_task_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tq_id", "value", name=op.f("pk_tq_sites")),
    )
    op.create_table(
        "tq_tags",
        sa.Column("tq_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("value", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["tq_id"],
            ["task_queues.id"],
            name=op.f("fk_tq_tags_tq_id_task_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tq_id", "value", name=op.f("pk_tq_tags")),
    )
    with op.batch_alter_table("tq_tags", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_tq_tags_value_tq_id"), ["value", "tq_id"], unique=False
        )


def downgrade() -> None:
    op.drop_table("tq_tags")
    op.drop_table("tq_sites")
    op.drop_table("tq_platforms")
    op.drop_table("tq_banned_sites")
    with op.batch_alter_table("task_queue_jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_queue_jobs_tq_id_rank_job_id"))

    op.drop_table("task_queue_jobs")
    with op.batch_alter_table("job_status_history", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_status_history_job_id"))

    op.drop_table("job_status_history")
    with op.batch_alter_table("task_queues", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_queues_owner_group_owner"))
        batch_op.drop_index(batch_op.f("ix_task_queues_active_vo_draw_key_id"))

    op.drop_table("task_queues")
    with op.batch_alter_table("submit_pool_queues", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_submit_pool_queues_site_ce_queue"))

    op.drop_table("submit_pool_queues")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_submit_pool_status"))
        batch_op.drop_index(batch_op.f("ix_jobs_status_id"))
        batch_op.drop_index(batch_op.f("ix_jobs_owner_status"))

    op.drop_table("jobs")
    op.drop_table("submit_pools")
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pilots_site_ce_queue_status"))

    op.drop_table("pilots")
