"""Pilots that hang in a CE state are timed out (issue 34 item 4). ``pilots`` keeps the CE's
own word for the pilot's state (``ce_state``: ACCEPTING, QUEUING, HELD ...) and since when it
says it (``ce_state_since``), and the state a pilot hung in past its timeout when the pilots
loop killed it for that (``hung_in``).

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-06 18:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0034"
down_revision: str | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ce_state", sa.String(length=32), server_default="",
                                      nullable=False))
        batch_op.add_column(sa.Column("ce_state_since", taskqueue.db.models.UTCDateTime(),
                                      nullable=True))
        batch_op.add_column(sa.Column("hung_in", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.drop_column("hung_in")
        batch_op.drop_column("ce_state_since")
        batch_op.drop_column("ce_state")
