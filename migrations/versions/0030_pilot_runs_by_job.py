"""An index of ``pilot_runs`` by job: the purge removes a job's runs with the job (before,
they stayed for ever, naming jobs that no longer exist), and finds them by ``job_id``, which
the primary key (vo, pilot_reference, job_id) does not lead with.

Creating it holds off writes to ``pilot_runs`` while the table is read. On a large live
PostgreSQL, create it beforehand without that lock, and this revision finds it there:
``CREATE INDEX CONCURRENTLY ix_pilot_runs_job_id ON pilot_runs (job_id)``.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-06 14:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0030"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(op.f("ix_pilot_runs_job_id"), "pilot_runs", ["job_id"], unique=False,
                    if_not_exists=True)


def downgrade() -> None:
    op.drop_index(op.f("ix_pilot_runs_job_id"), table_name="pilot_runs")
