"""The claim function (PostgreSQL) and procedure (MariaDB) installed from text files: this
migration's own copies, 0035_claim_postgresql.sql and 0035_claim_mariadb.sql, of the canonical
texts in taskqueue/matching/sql/. The rules are unchanged: the texts are those migrations 0026
(PostgreSQL) and 0015 (MariaDB) installed, so going back leaves the function as it is.

From here on a change of either is an edit of its canonical file and a new migration with its
own copy of the new text; tests/db/test_claim_sources.py holds what ``upgrade head`` installs
equal to the canonical files. No migration reads another migration's file.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-06 18:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "0035"
down_revision: str | None = "0034"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HERE = Path(__file__).resolve().parent


def _text(database: str) -> str:
    return (_HERE / f"0035_claim_{database}.sql").read_text(encoding="utf-8")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(_text("postgresql"))
    elif dialect in ("mysql", "mariadb"):
        op.execute(_text("mariadb"))


def downgrade() -> None:
    """Nothing to undo: the texts are those 0026 and 0015 installed."""
