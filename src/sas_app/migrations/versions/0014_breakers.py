"""breakers: agents' circuit breakers kept in the state store when no Redis holds them (a
RabbitMQ broker, the embedded one)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "breakers",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("value", sa.String(100), nullable=False),
        sa.Column("expires_at", sa.Double),
    )


def downgrade() -> None:
    op.drop_table("breakers")
