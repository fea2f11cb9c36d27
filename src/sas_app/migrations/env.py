"""Alembic environment: the URL comes from ``sas_app.store.migrate`` (never from a committed file)."""

from __future__ import annotations

from alembic import context

from sas_app.store import make_engine
from sas_app.store.schema import metadata

url = context.config.attributes["database_url"]
engine = make_engine(url)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
