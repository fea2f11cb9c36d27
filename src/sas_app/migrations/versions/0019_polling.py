"""polling: a polling step's interval and bound, how many times its action answered "not yet",
and the time past which it fails

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("steps", sa.Column("poll", sa.JSON().with_variant(JSONB(), "postgresql")))
    op.add_column("steps", sa.Column("polls", sa.Integer, nullable=False, server_default="0"))
    op.add_column("steps", sa.Column("poll_until", sa.Double))


def downgrade() -> None:
    op.drop_column("steps", "poll_until")
    op.drop_column("steps", "polls")
    op.drop_column("steps", "poll")
