"""Schema migrations: ``sas migrate`` runs Alembic's ``upgrade head`` against SAS_DATABASE_URL; the
embedded default (an SQLite file under SAS_HOME) is brought up to date on first use instead; on a
server database, a missing or outdated schema is one clear error naming ``sas migrate``."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine

MIGRATIONS = Path(__file__).parent.parent / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["database_url"] = database_url
    return config


def migrate(database_url: str, revision: str = "head") -> None:
    """Create or upgrade the state store's schema to ``revision``; safe to run again."""
    command.upgrade(alembic_config(database_url), revision)


@contextmanager
def schema_lock(home: Path) -> Iterator[None]:
    """Held while the embedded store's schema is checked or written: the processes of one SAS_HOME
    starting together do it one at a time."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".schema.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_schema(database_url: str, home: Path) -> None:
    """Create or upgrade the embedded store's schema if it is not at this sas_app's revision."""
    with schema_lock(home):
        engine = create_engine(database_url)
        try:
            behind = schema_problem(engine) is not None
        finally:
            engine.dispose()
        if behind:
            migrate(database_url)


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
