"""Pilot tokens renewed (issue 37 item 1): each pilot's record keeps how many times it had its
token renewed, when last, and when the last token it was given expires.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-06 18:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0032"
down_revision: str | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.add_column(sa.Column("token_renewals", sa.Integer(), server_default="0",
                                      nullable=False))
        batch_op.add_column(sa.Column("token_renewed_at", taskqueue.db.models.UTCDateTime(),
                                      nullable=True))
        batch_op.add_column(sa.Column("token_expires_at", taskqueue.db.models.UTCDateTime(),
                                      nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.drop_column("token_expires_at")
        batch_op.drop_column("token_renewed_at")
        batch_op.drop_column("token_renewals")
