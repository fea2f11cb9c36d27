"""scheduled starts: the schedules table (each schedule's last tick) and runs.schedule

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("schedule", sa.String(100)))
    op.create_index("ix_runs_schedule", "runs", ["schedule", "process_state"],
                    postgresql_where=sa.text("schedule IS NOT NULL"), sqlite_where=sa.text("schedule IS NOT NULL"))
    op.create_table(
        "schedules",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("last_tick", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("schedules")
    op.drop_index("ix_runs_schedule", table_name="runs")
    op.drop_column("runs", "schedule")
