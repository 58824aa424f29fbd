"""Pilots that never start, never find work, or never reach their CE (issue 34 items 3, 5, 6).

``director_queues`` keeps the failed starts in a row that stopped a queue's submissions
(``failed_starts``, ``starts_error``, ``starts_stopped_at``) and the pilots whose submission
never reached the queue's CE, in all (``unsent_pilots``: they leave no pilot record).
``pilots.missed_work`` says whether, when the matcher answered the pilot "no job", work its
queue could run was waiting (a mismatch) or not (an overshoot).

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-06 18:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0036"
down_revision: str | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("director_queues", schema=None) as batch_op:
        batch_op.add_column(sa.Column("failed_starts", sa.Integer(), server_default="0",
                                      nullable=False))
        batch_op.add_column(sa.Column("starts_error", sa.String(length=255),
                                      server_default="", nullable=False))
        batch_op.add_column(sa.Column("starts_stopped_at", taskqueue.db.models.UTCDateTime(),
                                      nullable=True))
        batch_op.add_column(sa.Column("unsent_pilots", sa.Integer(), server_default="0",
                                      nullable=False))
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.add_column(sa.Column("missed_work", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.drop_column("missed_work")
    with op.batch_alter_table("director_queues", schema=None) as batch_op:
        batch_op.drop_column("unsent_pilots")
        batch_op.drop_column("starts_stopped_at")
        batch_op.drop_column("starts_error")
        batch_op.drop_column("failed_starts")
