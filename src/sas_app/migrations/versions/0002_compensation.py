"""compensation rows, cancel, pause and operator-edited step input

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("cancelled_by", sa.String(200)))
        batch.add_column(sa.Column("paused_by", sa.String(200)))
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("undo", sa.String(401)))
        batch.add_column(sa.Column("compensates", sa.Integer))
        batch.add_column(sa.Column("input", _json))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("input")
        batch.drop_column("compensates")
        batch.drop_column("undo")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("paused_by")
        batch.drop_column("cancelled_by")
