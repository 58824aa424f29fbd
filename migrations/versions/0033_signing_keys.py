"""Payload tokens (issue 37 item 2): ``signing_keys`` holds the ES256 keys the service signs
payloads' tokens with; their public halves are published at the JWKS URI.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-06 18:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskqueue.db.models

revision: str = "0033"
down_revision: str | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "signing_keys",
        sa.Column("kid", sa.String(length=64), nullable=False),
        sa.Column("algorithm", sa.String(length=16), nullable=False),
        sa.Column("public_jwk", sa.Text(), nullable=False),
        sa.Column("private_key", sa.Text(), nullable=False),
        sa.Column("created_at", taskqueue.db.models.UTCDateTime(), nullable=False),
        sa.Column("retired_at", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.Column("drop_after", taskqueue.db.models.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("kid", name=op.f("pk_signing_keys")),
    )


def downgrade() -> None:
    op.drop_table("signing_keys")
