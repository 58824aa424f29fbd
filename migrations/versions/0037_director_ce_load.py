"""The CE's own state (issue 34 item 9): ``director_queues`` keeps what the queue's CE last
said of its jobs (an ARC-CE's GLUE2 share: running, waiting, in all, free slots, its limit of
jobs in all), when it was read and why the last read failed, and since when the CE has held
waiting jobs while running none.

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-06 18:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0037"
down_revision: str | None = "0036"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COUNTS = ("ce_running", "ce_waiting", "ce_total", "ce_free_slots", "ce_max_total")


def upgrade() -> None:
    with op.batch_alter_table("director_queues", schema=None) as batch_op:
        for name in COUNTS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("ce_read_at", taskqueue.db.models.UTCDateTime(),
                                      nullable=True))
        batch_op.add_column(sa.Column("ce_error", sa.String(length=255), server_default="",
                                      nullable=False))
        batch_op.add_column(sa.Column("ce_idle_since", taskqueue.db.models.UTCDateTime(),
                                      nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("director_queues", schema=None) as batch_op:
        batch_op.drop_column("ce_idle_since")
        batch_op.drop_column("ce_error")
        batch_op.drop_column("ce_read_at")
        for name in reversed(COUNTS):
            batch_op.drop_column(name)
