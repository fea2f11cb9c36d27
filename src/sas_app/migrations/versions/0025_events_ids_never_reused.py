"""events: on SQLite, ids never given twice (AUTOINCREMENT), so that a purge of the newest events
does not give their ids to the next ones; PostgreSQL's come from a sequence already

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    # SQLite sets AUTOINCREMENT only when a table is created: the table is built again, its rows
    # copied with their ids (which start its sequence at the largest) and its index made again
    with op.batch_alter_table("events", recreate="always", table_kwargs={"sqlite_autoincrement": True}):
        pass


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    with op.batch_alter_table("events", recreate="always", table_kwargs={"sqlite_autoincrement": False}):
        pass
