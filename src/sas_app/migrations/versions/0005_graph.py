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
    # Plain ADD COLUMNs, never a table rebuilt: on SQLite, rebuilding ``runs`` would cascade its
    # drop to the steps of every run in flight.
    op.add_column("runs", sa.Column("version", sa.String(100)))
    op.add_column("runs", sa.Column("linear", sa.Boolean, nullable=False, server_default=sa.true()))
    for column in (sa.Column("waits_for", _json), sa.Column("for_each", sa.String(300)),
                   sa.Column("max_parallel", sa.Integer), sa.Column("branch_of", sa.Integer),
                   sa.Column("branch", sa.Integer), sa.Column("item", _json)):
        op.add_column("steps", column)


def downgrade() -> None:
    for column in ("item", "branch", "branch_of", "max_parallel", "for_each", "waits_for"):
        op.drop_column("steps", column)
    op.drop_column("runs", "linear")
    op.drop_column("runs", "version")
