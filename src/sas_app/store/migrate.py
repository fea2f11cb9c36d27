"""Schema migrations: ``sas migrate`` runs Alembic's ``upgrade head`` against SAS_DATABASE_URL; the
embedded default (an SQLite file under SAS_HOME) is brought up to date on first use instead; on a
server database, a missing or outdated schema is one clear error naming ``sas migrate``."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, create_engine, inspect, text

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent.parent / "migrations"

#: the revision of the newest migration, the schema this sas_app needs (a unit test holds it to
#: Alembic's head). Checking a store against it reads one row and imports nothing of Alembic,
#: which every worker, beat and command does on starting: Alembic is imported to migrate.
SCHEMA_HEAD = "0025"
#: Alembic's table of the store's revision
VERSION_TABLE = "alembic_version"


def alembic_config(database_url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["database_url"] = database_url
    return config


def migrate(database_url: str, revision: str = "head") -> None:
    """Create or upgrade the state store's schema to ``revision``; safe to run again."""
    from alembic import command

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
    with engine.connect() as conn:
        current = (conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
                   if inspect(conn).has_table(VERSION_TABLE) else None)
    if current == SCHEMA_HEAD:
        return None
    if current is None:
        return "the state store has no schema yet: run `sas migrate`"
    return f"the state store's schema is at revision {current}, this sas_app needs {SCHEMA_HEAD}: run `sas migrate`"
