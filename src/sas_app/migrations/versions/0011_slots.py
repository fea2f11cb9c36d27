"""one run at a time per key: runs.slot, runs.max_running, runs.slot_since and their index

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("slot", sa.String(300)))
    op.add_column("runs", sa.Column("max_running", sa.Integer))
    op.add_column("runs", sa.Column("slot_since", sa.Double))
    op.create_index("ix_runs_slot", "runs", ["workflow", "slot", "process_state", "created_at"],
                    postgresql_where=sa.text("slot IS NOT NULL"), sqlite_where=sa.text("slot IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_runs_slot", table_name="runs")
    op.drop_column("runs", "slot_since")
    op.drop_column("runs", "max_running")
    op.drop_column("runs", "slot")
