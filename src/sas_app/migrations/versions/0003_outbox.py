"""outbox of progress notifications, alerts, run priority

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_json = sa.JSON().with_variant(JSONB(), "postgresql")
_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("priority", sa.Integer, nullable=False, server_default="5"))
    op.create_table(
        "outbox",
        sa.Column("id", _id, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("reply_to", sa.String(200), nullable=False),
        sa.Column("body", _json, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("sent_at", sa.Double),
    )
    op.create_index(
        "ix_outbox_unsent", "outbox", ["created_at"],
        postgresql_where=sa.text("sent_at IS NULL"),
        sqlite_where=sa.text("sent_at IS NULL"),
    )


    op.create_table(
        "alerts",
        sa.Column("id", _id, primary_key=True, autoincrement=True),
        sa.Column("dedup_key", sa.String(300), nullable=False, unique=True),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("position", sa.Integer),
        sa.Column("kind", sa.String(30), nullable=False),
        sa.Column("attempt", sa.Integer),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("at", sa.Double, nullable=False),
    )
    op.create_index("ix_alerts_at", "alerts", ["at"])


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("priority")
    op.drop_table("alerts")
    op.drop_table("outbox")
