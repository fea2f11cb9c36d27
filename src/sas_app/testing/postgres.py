"""A test environment's own schema in your PostgreSQL database, on its virtual clock.

The schema holds sas_app's tables, made by its migrations, and a ``statement_timestamp()`` that
reads the time the environment's engine writes before each transaction; the environment reaches it
through its search path, ahead of PostgreSQL's own catalog, so every complete-by, sleep and wait the
store compares runs on the virtual clock. Nothing outside the schema is touched, and dropping it
removes all of it: tests running side by side each have their own.
"""

from __future__ import annotations

import uuid

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from sas_app.store.connection import PG_CLOCK_SETTING, connection_limits
from sas_app.store.migrate import migrate

_CLOCK = """CREATE FUNCTION "{schema}".statement_timestamp() RETURNS timestamptz LANGUAGE sql STABLE
AS $$ SELECT pg_catalog.to_timestamp(pg_catalog.current_setting('{setting}')::double precision) $$"""


class ScratchSchema:
    """A schema of its own in the PostgreSQL database at ``url`` (a user that may create schemas
    there): :attr:`url` reaches it; :meth:`drop` removes it and everything in it."""

    def __init__(self, url: str) -> None:
        parsed = make_url(url)
        if parsed.get_backend_name() != "postgresql":
            raise ValueError(f"a test environment's database must be PostgreSQL (or none: SQLite in a temporary "
                             f"folder), not {parsed.get_backend_name()!r}")
        self.name = f"sas_test_{uuid.uuid4().hex[:12]}"
        # bounded as the store's own connections are: a server that never answers is an error, not a hang
        self._admin = create_engine(parsed, isolation_level="AUTOCOMMIT", poolclass=NullPool,
                                    connect_args=connection_limits(parsed))
        try:
            with self._admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE SCHEMA "{self.name}"')
                conn.exec_driver_sql(_CLOCK.format(schema=self.name, setting=PG_CLOCK_SETTING))
        except Exception as exc:
            self._admin.dispose()
            raise ValueError(f"cannot make a test schema in {parsed.render_as_string()}: {exc}") from exc
        options = " ".join(filter(None, [str(parsed.query.get("options", "")),
                                         f"-csearch_path={self.name},pg_catalog"]))
        self.url = parsed.update_query_dict({"options": options}).render_as_string(hide_password=False)
        try:
            migrate(self.url)
        except BaseException:
            self.drop()
            raise

    def drop(self) -> None:
        with self._admin.connect() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')
        self._admin.dispose()
