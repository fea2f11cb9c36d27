"""the pattern's escalation at a step's failure threshold: steps.escalate and steps.escalated

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("steps", sa.Column("escalate", sa.JSON().with_variant(JSONB(), "postgresql")))
    op.add_column("steps", sa.Column("escalated", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("steps", "escalated")
    op.drop_column("steps", "escalate")
