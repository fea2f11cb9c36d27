"""Schema migrations: ``sas migrate`` runs Alembic's ``upgrade head`` against SAS_DATABASE_URL."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["database_url"] = database_url
    return config


def migrate(database_url: str, revision: str = "head") -> None:
    """Create or upgrade the state store's schema to ``revision``; safe to run again."""
    command.upgrade(alembic_config(database_url), revision)
