"""looks: when the at-risk watch last looked, so that two beats (or looks arriving together) do
not look twice within half an interval

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "looks",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("at", sa.Double, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("looks")
