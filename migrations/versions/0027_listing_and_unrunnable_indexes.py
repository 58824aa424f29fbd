"""Three indexes of jobs. The listings of the jobs at a site and of an owner group read a page
in id order and stop (``site, id`` and ``owner_group, id``; before, a page read all of a
site's or group's jobs: 2.2 s and 0.6 s at ten million jobs). And the Waiting jobs that no
configured queue can run get a partial index of their own, on PostgreSQL and SQLite: the
watchdog looks them up at every turn, and without it read every Waiting job to find the few
flagged (ten million rows at the scale bench/ten_million.py loads). MariaDB has no partial
indexes; there the watchdog reads the Waiting jobs as before.

Creating them holds off writes to ``jobs`` while the table is read (seconds per million
jobs). On a large live PostgreSQL, create them beforehand without that lock, and this
revision finds them there: ``CREATE INDEX CONCURRENTLY ix_jobs_site_id ON jobs (site, id)``,
the same for ``ix_jobs_owner_group_id ON jobs (owner_group, id)``, and
``CREATE INDEX CONCURRENTLY ix_jobs_unrunnable ON jobs (id) WHERE status = 'Waiting' AND
minor_status = 'No configured queue can run it (see explain)'``.

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-28 19:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The minor status as it was when this revision was written (the index holds these rows).
_PREDICATE = ("status = 'Waiting' AND minor_status = "
              "'No configured queue can run it (see explain)'")
_PARTIAL = ("postgresql", "sqlite")


def upgrade() -> None:
    op.create_index(op.f("ix_jobs_site_id"), "jobs", ["site", "id"], unique=False,
                    if_not_exists=True)
    op.create_index(op.f("ix_jobs_owner_group_id"), "jobs", ["owner_group", "id"],
                    unique=False, if_not_exists=True)
    if op.get_bind().dialect.name in _PARTIAL:
        op.create_index("ix_jobs_unrunnable", "jobs", ["id"], unique=False,
                        postgresql_where=sa.text(_PREDICATE), sqlite_where=sa.text(_PREDICATE),
                        if_not_exists=True)


def downgrade() -> None:
    if op.get_bind().dialect.name in _PARTIAL:
        op.drop_index("ix_jobs_unrunnable", table_name="jobs", if_exists=True)
    op.drop_index(op.f("ix_jobs_owner_group_id"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_site_id"), table_name="jobs")
