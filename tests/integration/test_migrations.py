"""Migrations on PostgreSQL that a deployment runs while its workers write: an index built
concurrently, and built again after a build that was cut short."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from sas_app import migrate
from sas_app.store.migrate import SCHEMA_HEAD
from sas_app.store.schema import metadata


def test_an_index_build_cut_short_is_dropped_and_built_again(db_url):
    migrate(db_url, "0022")
    engine = create_engine(db_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("INSERT INTO runs (id, workflow, business_key, payload, created_at, updated_at) "
                          "VALUES ('r1', 'w', 'k', '{}', 0, 0)"))
        conn.execute(text("INSERT INTO steps (run_id, position, name, agent, action, timeout, max_failures, "
                          "idempotency_key, created_at, updated_at) VALUES ('r1', 0, 's', 'a', 'x', 1, 1, 'i', 0, 0)"))
        # a concurrent build that fails on a row, as one cut short by a timeout would: left invalid
        with pytest.raises(Exception, match="division by zero"):
            conn.execute(text("CREATE INDEX CONCURRENTLY ix_steps_running_untimed "
                              "ON steps ((1 / (position - position)))"))
        assert conn.execute(text("SELECT indisvalid FROM pg_index "
                                 "WHERE indexrelid = 'ix_steps_running_untimed'::regclass")).scalar() is False

    migrate(db_url)  # runs again, where it would stop at "already exists"

    with engine.connect() as conn:
        assert conn.execute(text("SELECT indisvalid FROM pg_index "
                                 "WHERE indexrelid = 'ix_steps_running_untimed'::regclass")).scalar() is True
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == SCHEMA_HEAD
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    engine.dispose()
