"""a deadline for the whole run: runs.deadline, and the Supervisor's index of live runs that have one

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_LIVE = "deadline IS NOT NULL AND process_state IN ('pending', 'processing')"


def upgrade() -> None:
    op.add_column("runs", sa.Column("deadline", sa.Double))
    op.create_index("ix_runs_deadline", "runs", ["deadline"], postgresql_where=sa.text(_LIVE),
                    sqlite_where=sa.text(_LIVE))


def downgrade() -> None:
    op.drop_index("ix_runs_deadline", table_name="runs")
    op.drop_column("runs", "deadline")
