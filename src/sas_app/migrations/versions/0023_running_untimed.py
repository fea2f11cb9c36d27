"""running untimed: a partial index of the steps running with no complete-by of their own (each
waiting for its child run, or for its fan-out's branches), so that the Supervisor's look for
children that ended reads those steps, not the whole steps table, at every sweep

On PostgreSQL the index is built concurrently, outside the migration's transaction: writes to
``steps`` go on while it is built (a plain build would hold them for a scan of the whole table).
A concurrent build cut short (a statement timeout, the process killed) leaves an invalid index of
that name behind, which the next attempt drops before it builds again. The build also waits for
every transaction older than itself in the database to end.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

NAME = "ix_steps_running_untimed"
UNTIMED = "state = 'running' AND complete_by IS NULL"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        with op.get_context().autocommit_block():
            valid = bind.execute(sa.text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)"),
                                 {"name": NAME}).scalar()
            if valid is False:  # left by a build cut short
                op.execute(sa.text(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}"))
            op.create_index(NAME, "steps", ["run_id", "position"], postgresql_where=sa.text(UNTIMED),
                            postgresql_concurrently=True, if_not_exists=True)
    else:
        op.create_index(NAME, "steps", ["run_id", "position"], sqlite_where=sa.text(UNTIMED))


def downgrade() -> None:
    op.drop_index(NAME, table_name="steps")
