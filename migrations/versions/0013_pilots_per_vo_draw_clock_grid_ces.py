"""Pilot references are unique per VO, not across VOs: one VO's pilot cannot register, shadow
or end another VO's pilot by naming its reference. Task queues remember the draw time their
key was drawn from (draw_clock), so that new queues start from the draw's current time.
The computing elements a queue's jobs may run on (GridCE) are kept in tq_ces.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25 19:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_pilots_reference"), type_="unique")
        batch_op.create_unique_constraint(batch_op.f("uq_pilots_reference_vo"),
                                          ["reference", "vo"])
    with op.batch_alter_table("task_queues", schema=None) as batch_op:
        batch_op.add_column(sa.Column("draw_clock", sa.Float(), server_default="0",
                                      nullable=False))
        batch_op.create_index(batch_op.f("ix_task_queues_active_vo_draw_clock"),
                              ["active", "vo", "draw_clock"], unique=False)


    op.create_table(
        "tq_ces",
        sa.Column("tq_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("value", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(["tq_id"], ["task_queues.id"],
                                name=op.f("fk_tq_ces_tq_id_task_queues"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tq_id", "value", name=op.f("pk_tq_ces")),
    )


def downgrade() -> None:
    op.drop_table("tq_ces")
    with op.batch_alter_table("task_queues", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_queues_active_vo_draw_clock"))
        batch_op.drop_column("draw_clock")
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_pilots_reference_vo"), type_="unique")
        batch_op.create_unique_constraint(batch_op.f("uq_pilots_reference"), ["reference"])
