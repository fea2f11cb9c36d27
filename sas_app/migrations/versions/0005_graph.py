"""steps that run in parallel and join, and fan out over a list; the definition's version per run

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23

Every new column may be NULL (or has a default), so a run written before this revision keeps
running after it: a step with no ``waits_for`` waits for the step before it, and a run with
``linear`` (the default) takes the one-statement hot path it always took.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_json = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("version", sa.String(100)))
        batch.add_column(sa.Column("linear", sa.Boolean, nullable=False, server_default=sa.true()))
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("waits_for", _json))
        batch.add_column(sa.Column("for_each", sa.String(300)))
        batch.add_column(sa.Column("max_parallel", sa.Integer))
        batch.add_column(sa.Column("branch_of", sa.Integer))
        batch.add_column(sa.Column("branch", sa.Integer))
        batch.add_column(sa.Column("item", _json))


def downgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        for column in ("item", "branch", "branch_of", "max_parallel", "for_each", "waits_for"):
            batch.drop_column(column)
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("linear")
        batch.drop_column("version")
