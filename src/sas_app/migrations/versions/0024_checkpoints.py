"""checkpoints: how far the dashboard's counters have read the events table, so that one started
over a long history resumes there

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("last_id", sa.BigInteger, nullable=False),
        sa.Column("state", sa.JSON, nullable=False),
        sa.Column("at", sa.Double, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("checkpoints")
