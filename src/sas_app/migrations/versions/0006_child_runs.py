"""child runs: a run started by another run's step, and the step that starts it

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23

Plain ADD COLUMNs (never a rebuilt table: on SQLite that would cascade to the steps of every run
in flight); a run written before has no parent and depth 0.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("parent_run_id", sa.String(32)))
    op.add_column("runs", sa.Column("parent_position", sa.Integer))
    op.add_column("runs", sa.Column("depth", sa.Integer, nullable=False, server_default="0"))
    op.add_column("steps", sa.Column("child", sa.String(200)))
    op.create_index("ix_runs_parent", "runs", ["parent_run_id"], postgresql_where=sa.text("parent_run_id IS NOT NULL"),
                    sqlite_where=sa.text("parent_run_id IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_runs_parent", "runs")
    op.drop_column("steps", "child")
    op.drop_column("runs", "depth")
    op.drop_column("runs", "parent_position")
    op.drop_column("runs", "parent_run_id")
