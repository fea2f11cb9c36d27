"""waits for an event: steps.event and steps.on_timeout, and the signals sent to runs

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23

Plain ADD COLUMNs (never a rebuilt table: on SQLite that would cascade to the steps of every run
in flight) and a new table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_WAITING = "state = 'pending' AND (sleep IS NOT NULL OR sleep_until IS NOT NULL OR event IS NOT NULL)"


def upgrade() -> None:
    op.add_column("steps", sa.Column("event", sa.String(100)))
    op.add_column("steps", sa.Column("on_timeout", sa.String(20)))
    op.create_table(
        "signals",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("event", sa.String(100), nullable=False),
        sa.Column("payload", sa.JSON().with_variant(JSONB(), "postgresql")),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("position", sa.Integer),
        sa.Column("sent_by", sa.String(200)),
        sa.Column("received_at", sa.Double, nullable=False),
    )
    op.create_index("ix_signals_run_event", "signals", ["run_id", "event"])
    op.create_index("ix_steps_waiting", "steps", ["event"], postgresql_where=sa.text(_WAITING),
                    sqlite_where=sa.text(_WAITING))


def downgrade() -> None:
    op.drop_index("ix_steps_waiting", table_name="steps")
    op.drop_index("ix_signals_run_event", table_name="signals")
    op.drop_table("signals")
    op.drop_column("steps", "on_timeout")
    op.drop_column("steps", "event")
