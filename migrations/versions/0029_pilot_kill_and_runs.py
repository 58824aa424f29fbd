"""What a pilot kill needs. ``pilots.heard_after_end_at``: when a pilot was first heard from
(a match request or a heartbeat) after its record said it ended (its CE said so, e.g. an
ARC-CE whose back end ignored a cancel); the pilot's page shows it, and the pilot is told to
stop. ``pilot_runs``: which jobs each pilot started (its first Running report on a job),
kept when the job is rescheduled to another pilot, so that the pilot's page lists every job
the pilot ran, not only the jobs whose latest attempt is its own.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06 10:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0029"
down_revision: str | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pilots", sa.Column("heard_after_end_at", taskqueue.db.models.UTCDateTime(),
                                      nullable=True))
    op.create_table(
        "pilot_runs",
        sa.Column("vo", sa.String(length=64), nullable=False),
        sa.Column("pilot_reference", sa.String(length=255), nullable=False),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  nullable=False),
        sa.Column("started_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("vo", "pilot_reference", "job_id"),
    )


def downgrade() -> None:
    op.drop_table("pilot_runs")
    op.drop_column("pilots", "heard_after_end_at")
