"""Pilots followed to their end through their compute element: the exit code, the standard
output and error kept in the sandbox store once the CE says the pilot ended (log_state,
log_id, log_note), and an operator's request to kill a pilot through its CE
(kill_requested_by).

Pilots that had already ended are marked as having no log, so that the director does not
ask their CEs about them.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ENDED = ("Done", "Failed", "Aborted", "Lost")


def upgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.add_column(sa.Column("exit_code", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("log_state", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("log_id", sa.String(length=80), nullable=True))
        batch_op.add_column(sa.Column("log_note", sa.String(length=255), server_default="",
                                      nullable=False))
        batch_op.add_column(sa.Column("kill_requested_by", sa.String(length=255),
                                      nullable=True))
        batch_op.create_index(batch_op.f("ix_pilots_log_state_executor"),
                              ["log_state", "executor"], unique=False)
    pilots = sa.table("pilots", sa.column("status", sa.String), sa.column("log_state", sa.String),
                      sa.column("log_note", sa.String))
    op.execute(pilots.update().where(pilots.c.status.in_(ENDED)).values(
        log_state="unavailable", log_note="ended before pilot logs were kept"))


def downgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pilots_log_state_executor"))
        batch_op.drop_column("kill_requested_by")
        batch_op.drop_column("log_note")
        batch_op.drop_column("log_id")
        batch_op.drop_column("log_state")
        batch_op.drop_column("exit_code")
