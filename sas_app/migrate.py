"""Schema migrations: ``sas migrate`` runs Alembic's ``upgrade head`` against SAS_DATABASE_URL."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["database_url"] = database_url
    return config


def migrate(database_url: str, revision: str = "head") -> None:
    """Create or upgrade the state store's schema to ``revision``; safe to run again."""
    command.upgrade(alembic_config(database_url), revision)


def schema_problem(engine: Engine) -> str | None:
    """Why the store's schema does not fit this version of sas_app (with what to do), or None."""
    head = ScriptDirectory.from_config(alembic_config(str(engine.url))).get_current_head()
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    if current == head:
        return None
    if current is None:
        return "the state store has no schema yet: run `sas migrate`"
    return f"the state store's schema is at revision {current}, this sas_app needs {head}: run `sas migrate`"
