"""The replica catalogue: which storage elements hold a replica of each file of a VO (the
optimizer chain's data step sends a job with InputData only to sites that reach them).

Revision ID: 0020
Revises: 0017
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0020"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "file_replicas",
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("lfn_key", sa.String(length=64), nullable=False),
        sa.Column("se", sa.String(length=64), nullable=False),
        sa.Column("lfn", sa.String(length=1024), nullable=False),
        sa.Column("registered_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("vo", "lfn_key", "se", name=op.f("pk_file_replicas")),
    )
    with op.batch_alter_table("file_replicas", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_file_replicas_vo_se"), ["vo", "se"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("file_replicas", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_file_replicas_vo_se"))
    op.drop_table("file_replicas")
