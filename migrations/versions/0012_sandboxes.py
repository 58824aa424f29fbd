"""Sandboxes: the archives of files jobs take in and bring back, their owners, and the jobs
that reference them.

Revision ID: 0012
Revises: 0009
Create Date: 2026-11-25 19:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sandboxes",
        sa.Column("id", sa.String(length=80), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sandboxes")),
    )
    op.create_table(
        "sandbox_owners",
        sa.Column("sandbox_id", sa.String(length=80), nullable=False),
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=255), nullable=False),
        sa.Column("owner_group", sa.String(length=128), nullable=False),
        sa.Column("output", sa.Integer(), nullable=False),
        sa.Column("created_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["sandbox_id"], ["sandboxes.id"],
                                name=op.f("fk_sandbox_owners_sandbox_id_sandboxes"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("sandbox_id", "vo", "owner", name=op.f("pk_sandbox_owners")),
    )
    with op.batch_alter_table("sandbox_owners", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sandbox_owners_vo_owner"), ["vo", "owner"],
                              unique=False)
    op.create_table(
        "job_sandboxes",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  nullable=False),
        sa.Column("sandbox_id", sa.String(length=80), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"],
                                name=op.f("fk_job_sandboxes_job_id_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["sandbox_id"], ["sandboxes.id"],
                                name=op.f("fk_job_sandboxes_sandbox_id_sandboxes")),
        sa.PrimaryKeyConstraint("job_id", "sandbox_id", "kind", name=op.f("pk_job_sandboxes")),
    )
    with op.batch_alter_table("job_sandboxes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_sandboxes_sandbox_id_job_id"),
                              ["sandbox_id", "job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_sandboxes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_sandboxes_sandbox_id_job_id"))
    op.drop_table("job_sandboxes")
    with op.batch_alter_table("sandbox_owners", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sandbox_owners_vo_owner"))
    op.drop_table("sandbox_owners")
    op.drop_table("sandboxes")
