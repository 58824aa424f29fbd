"""Payloads isolated (issue 38 item 4): each pilot's record keeps how it isolates its payloads,
as it said when it registered (the tool and its version, or "none").

Revision ID: 0038
Revises: 0037
Create Date: 2026-12-06 19:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0038"
down_revision: str | None = "0037"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.add_column(sa.Column("isolation", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.drop_column("isolation")
