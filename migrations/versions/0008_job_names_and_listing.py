"""Job names and groups as columns, and the indexes that keep job listings fast with millions
of jobs (keyset pages by owner, group and name in id order; "since" by submission time).

Revision ID: 0008
Revises: 0003
Create Date: 2026-11-23 22:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("job_name", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("job_group", sa.String(length=128), nullable=True))
        batch_op.create_index(batch_op.f("ix_jobs_vo_owner_id"), ["vo", "owner", "id"],
                              unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_job_group_id"), ["job_group", "id"],
                              unique=False,
                              postgresql_ops={"job_group": "varchar_pattern_ops"})
        batch_op.create_index(batch_op.f("ix_jobs_job_name_id"), ["job_name", "id"],
                              unique=False, postgresql_ops={"job_name": "varchar_pattern_ops"})
        batch_op.create_index(batch_op.f("ix_jobs_submitted_at_id"), ["submitted_at", "id"],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_submitted_at_id"))
        batch_op.drop_index(batch_op.f("ix_jobs_job_name_id"))
        batch_op.drop_index(batch_op.f("ix_jobs_job_group_id"))
        batch_op.drop_index(batch_op.f("ix_jobs_vo_owner_id"))
        batch_op.drop_column("job_group")
        batch_op.drop_column("job_name")
