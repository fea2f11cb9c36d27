"""choices: a step's condition (``when=`` / ``unless=``), which the planner decides; a step not
taken ends ``skipped``

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("steps", sa.Column("condition", sa.String(300)))


def downgrade() -> None:
    op.drop_column("steps", "condition")
