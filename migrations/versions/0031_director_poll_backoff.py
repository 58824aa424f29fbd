"""Back-off from what actually failed (issue 34 item 2). ``director_queues`` keeps the polls
of a queue's CE that failed in a row (the pilots loop) apart from its failed submissions:
``poll_failures``, ``poll_skip_until`` and ``poll_error``, which a successful poll clears; and
``retry_requested_at`` / ``retry_requested_by``, an operator's request to try the queue again
now (``gridpilot director retry``, the sites page's button).

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-06 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0031"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("director_queues", schema=None) as batch_op:
        batch_op.add_column(sa.Column("poll_failures", sa.Integer(), server_default="0",
                                      nullable=False))
        batch_op.add_column(sa.Column("poll_skip_until", taskqueue.db.models.UTCDateTime(),
                                      nullable=True))
        batch_op.add_column(sa.Column("poll_error", sa.String(length=255), server_default="",
                                      nullable=False))
        batch_op.add_column(sa.Column("retry_requested_at", taskqueue.db.models.UTCDateTime(),
                                      nullable=True))
        batch_op.add_column(sa.Column("retry_requested_by", sa.String(length=255),
                                      server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("director_queues", schema=None) as batch_op:
        batch_op.drop_column("retry_requested_by")
        batch_op.drop_column("retry_requested_at")
        batch_op.drop_column("poll_error")
        batch_op.drop_column("poll_skip_until")
        batch_op.drop_column("poll_failures")
