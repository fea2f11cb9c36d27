"""due indexes: the Supervisor's partial indexes over pending runs and live steps also require
``complete_by IS NOT NULL``, so that a fenced update of one run or step ("this id, if still
pending") cannot be planned through them instead of the primary key (with statistics taken
before a burst, PostgreSQL did, walking every live row: 5 ms a step with 10,000 in flight)

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

OLD = {"runs": ("ix_runs_pending_complete_by", "process_state = 'pending'"),
       "steps": ("ix_steps_live_complete_by", "state IN ('pending', 'running')")}


def _recreate(predicate: str) -> None:
    for table, (name, old) in OLD.items():
        where = sa.text(predicate.format(old=old))
        op.drop_index(name, table_name=table)
        op.create_index(name, table, ["complete_by"], postgresql_where=where, sqlite_where=where)


def upgrade() -> None:
    _recreate("complete_by IS NOT NULL AND {old}")


def downgrade() -> None:
    _recreate("{old}")
