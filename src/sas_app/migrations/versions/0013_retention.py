"""retention: a run's alerts and notifications found by its id, so deleting a batch of runs reads
only their rows

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_alerts_run", "alerts", ["run_id"])
    op.create_index("ix_outbox_run", "outbox", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_outbox_run", table_name="outbox")
    op.drop_index("ix_alerts_run", table_name="alerts")
