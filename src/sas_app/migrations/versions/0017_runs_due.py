"""runs due: the Supervisor's partial index over runs with a due time covers live runs asked about
(processing or compensating, with a complete-by), not only pending ones, so that a run whose
Scheduler's message was lost after an operator's resume is found as a lost submit is

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

PENDING = "complete_by IS NOT NULL AND process_state = 'pending'"
DUE = "complete_by IS NOT NULL AND process_state IN ('pending', 'processing', 'compensating')"


def upgrade() -> None:
    op.drop_index("ix_runs_pending_complete_by", table_name="runs")
    op.create_index("ix_runs_due", "runs", ["complete_by"], postgresql_where=sa.text(DUE), sqlite_where=sa.text(DUE))


def downgrade() -> None:
    op.drop_index("ix_runs_due", table_name="runs")
    op.execute(sa.text("UPDATE runs SET complete_by = NULL WHERE process_state <> 'pending'"))
    op.create_index("ix_runs_pending_complete_by", "runs", ["complete_by"], postgresql_where=sa.text(PENDING),
                    sqlite_where=sa.text(PENDING))
