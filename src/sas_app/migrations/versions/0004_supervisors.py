"""supervisors: one heartbeat row per Supervisor process; runs indexed by creation time

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "supervisors",
        sa.Column("instance", sa.String(200), primary_key=True),
        sa.Column("sweeps", sa.BigInteger, nullable=False),
        sa.Column("recovered", sa.BigInteger, nullable=False),
        sa.Column("last_sweep_at", sa.Double, nullable=False),
    )
    op.create_index("ix_runs_created", "runs", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_created", "runs")
    op.drop_table("supervisors")
