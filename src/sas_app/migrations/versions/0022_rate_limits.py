"""rate_limits: agents' rate limits shared by every worker, kept in the state store when no
Redis holds them (a RabbitMQ broker, the embedded one)

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_limits",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("next_at", sa.Double, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rate_limits")
