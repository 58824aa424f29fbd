"""GPUs, a matching rule (issue 36 item 3): a task queue's definition holds the bucket of the
GPUs its jobs need (``task_queues.gpus``, 0 for none), and the claim function (PostgreSQL) and
procedure (MariaDB) take the GPUs a pilot offers (``p_gpus``, after ``p_mem``) and keep to
queues that need at most that many. This migration's own copies of the canonical texts of
taskqueue/matching/sql/ are 0039_claim_postgresql.sql and 0039_claim_mariadb.sql; going back
installs 0039_before_claim_*.sql, its copies of the texts it replaced.

Revision ID: 0039
Revises: 0038
Create Date: 2026-12-06 20:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0039"
down_revision: str | None = "0038"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HERE = Path(__file__).resolve().parent

#: The PostgreSQL function's arguments before and after this migration (a function is known by
#: its arguments: the old one is dropped, not replaced).
_OLD_SIGNATURE = ("text, text, text[], bigint, bigint, bigint, text[], text[], text[], text[], "
                  "text[], text, text[], boolean, text, timestamp, text, text, "
                  "double precision[]")
_NEW_SIGNATURE = ("text, text, text[], bigint, bigint, bigint, bigint, text[], text[], text[], "
                  "text[], text[], text, text[], boolean, text, timestamp, text, text, "
                  "double precision[]")


def _text(database: str, which: str = "claim") -> str:
    return (_HERE / f"0039_{which}_{database}.sql").read_text(encoding="utf-8")


def upgrade() -> None:
    # Not in batch mode: SQLite's batch copy of task_queues would drop the table its queue
    # counts (tq_waiting) cascade from, and lose them.
    op.add_column("task_queues", sa.Column("gpus", sa.Integer(), nullable=False,
                                           server_default="0"))
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS gridpilot_claim({_OLD_SIGNATURE})")
        op.execute(_text("postgresql"))
    elif dialect in ("mysql", "mariadb"):
        op.execute(_text("mariadb"))


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS gridpilot_claim({_NEW_SIGNATURE})")
        op.execute(_text("postgresql", "before_claim"))
    elif dialect in ("mysql", "mariadb"):
        op.execute(_text("mariadb", "before_claim"))
    op.drop_column("task_queues", "gpus")
