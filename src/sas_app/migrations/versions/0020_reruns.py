"""reruns: a run started again after a fix (``sas rerun RUN --from STEP``) names the run it
reruns and the step it reran from; the old run names its rerun

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("rerun_of", sa.String(32)))
    op.add_column("runs", sa.Column("rerun_from", sa.String(200)))
    op.add_column("runs", sa.Column("rerun_as", sa.String(32)))


def downgrade() -> None:
    op.drop_column("runs", "rerun_as")
    op.drop_column("runs", "rerun_from")
    op.drop_column("runs", "rerun_of")
