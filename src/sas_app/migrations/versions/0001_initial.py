"""runs, steps and events

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_json = sa.JSON().with_variant(JSONB(), "postgresql")
_event_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("workflow", sa.String(200), nullable=False),
        sa.Column("business_key", sa.String(200), nullable=False),
        sa.Column("payload", _json, nullable=False),
        sa.Column("process_state", sa.String(20), nullable=False, server_default="pending"),
        sa.Column("locked_by", sa.String(200)),
        sa.Column("complete_by", sa.Double),
        sa.Column("failure_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("reply_to", sa.String(200)),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.UniqueConstraint("workflow", "business_key", name="uq_runs_workflow_business_key"),
    )
    op.create_index(
        "ix_runs_pending_complete_by", "runs", ["complete_by"],
        postgresql_where=sa.text("process_state = 'pending'"),
        sqlite_where=sa.text("process_state = 'pending'"),
    )
    op.create_index("ix_runs_state_created", "runs", ["process_state", "created_at"])
    op.create_table(
        "steps",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("agent", sa.String(200), nullable=False),
        sa.Column("action", sa.String(200), nullable=False),
        sa.Column("state", sa.String(20), nullable=False, server_default="not_started"),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("locked_by", sa.String(200)),
        sa.Column("complete_by", sa.Double),
        sa.Column("not_before", sa.Double),
        sa.Column("timeout", sa.Double, nullable=False),
        sa.Column("max_failures", sa.Integer, nullable=False),
        sa.Column("failure_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("idempotency_key", sa.String(300), nullable=False),
        sa.Column("result", _json),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.Column("completed_at", sa.Double),
        sa.UniqueConstraint("run_id", "position", name="uq_steps_run_position"),
    )
    op.create_index(
        "ix_steps_live_complete_by", "steps", ["complete_by"],
        postgresql_where=sa.text("state IN ('pending', 'running')"),
        sqlite_where=sa.text("state IN ('pending', 'running')"),
    )
    op.create_table(
        "events",
        sa.Column("id", _event_id, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("position", sa.Integer),
        sa.Column("kind", sa.String(30), nullable=False),
        sa.Column("from_state", sa.String(20)),
        sa.Column("to_state", sa.String(20)),
        sa.Column("attempt", sa.Integer),
        sa.Column("actor", sa.String(200)),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("detail", _json),
    )
    op.create_index("ix_events_run", "events", ["run_id", "id"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("steps")
    op.drop_table("runs")
