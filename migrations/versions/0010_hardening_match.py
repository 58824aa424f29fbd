"""Pilot references are unique per VO, not across VOs: one VO's pilot cannot register, shadow
or end another VO's pilot by naming its reference.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 19:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_pilots_reference"), type_="unique")
        batch_op.create_unique_constraint(batch_op.f("uq_pilots_reference_vo"),
                                          ["reference", "vo"])


def downgrade() -> None:
    with op.batch_alter_table("pilots", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_pilots_reference_vo"), type_="unique")
        batch_op.create_unique_constraint(batch_op.f("uq_pilots_reference"), ["reference"])
