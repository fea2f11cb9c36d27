"""durable sleeps: a step that waits in the store until a time

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23

Plain ADD COLUMNs (never a rebuilt table: on SQLite that would cascade to the steps of every run
in flight).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("steps", sa.Column("sleep", sa.Double))
    op.add_column("steps", sa.Column("sleep_until", sa.String(300)))


def downgrade() -> None:
    op.drop_column("steps", "sleep_until")
    op.drop_column("steps", "sleep")
