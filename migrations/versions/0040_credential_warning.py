"""CE credentials per VO and per CE (issue 37 item 3): ``director_queues`` keeps why the
credential the queue's CE is reached with will soon stop working (a token near its end that
its file has not replaced), for the sites page.

Revision ID: 0040
Revises: 0039
Create Date: 2026-12-06 19:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0040"
down_revision: str | None = "0039"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("director_queues", schema=None) as batch_op:
        batch_op.add_column(sa.Column("credential_warning", sa.String(length=255),
                                      server_default="", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("director_queues", schema=None) as batch_op:
        batch_op.drop_column("credential_warning")
