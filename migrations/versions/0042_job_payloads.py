"""What a pilot is handed of a job's description, stored once (issue 36 item 2):
``job_payloads`` keeps, per job, the payload fields read from its description as compact
JSON, so that a match answer does not parse the description again. Jobs stored before it have
no row and are answered from their description.

Revision ID: 0042
Revises: 0041
Create Date: 2026-12-07 02:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0042"
down_revision: str | None = "0041"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_payloads",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=False, nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_payloads")),
    )


def downgrade() -> None:
    op.drop_table("job_payloads")
