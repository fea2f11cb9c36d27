"""The test kit with its stores in the user's PostgreSQL: each environment in a schema of its own,
on its virtual clock, and nothing left behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from sas_app import SasApp, Settings, Step, Workflow
from sas_app.testing import Environment, VirtualClock

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def schemas_and_tables(url: str) -> tuple[list[str], list[str]]:
    """The test schemas in the database, and the tables outside them."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            schemas = list(conn.execute(text("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'sas\\_test\\_%'"))
                           .scalars())
        return schemas, inspect(engine).get_table_names(schema="public")
    finally:
        engine.dispose()


def test_the_examples_tests_pass_with_their_stores_in_postgresql_and_leave_nothing(db_url, tmp_path):
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                           "--sas-database-url", db_url, "examples"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout.splitlines()[-1]
    assert schemas_and_tables(db_url) == ([], [])


def test_an_environment_s_store_is_its_own_schema_on_the_virtual_clock(db_url, tmp_path):
    app = SasApp(Settings(home=tmp_path / "home", broker_url="memory://localhost/"))
    app.agent("svc").action(lambda call: {"ok": True}, name="work")
    app.register(Workflow("one", [Step("a", "svc.work", timeout=5)]))
    with Environment(app, database_url=db_url, start=1_000_000_000) as env, \
            Environment(app, database_url=db_url, start=2_000_000_000) as other:
        assert env.app.store.engine.dialect.name == "postgresql"
        assert (env.app.store.now(), other.app.store.now()) == (1_000_000_000, 2_000_000_000)
        view = env.run("one")
        assert view.run.created_at == 1_000_000_000
        assert other.app.store.find_run("one", view.run.business_key) is None  # a store each
        assert len(schemas_and_tables(db_url)[0]) == 2
    assert schemas_and_tables(db_url) == ([], [])


def test_a_clock_injected_on_postgresql_without_a_test_schema_is_refused(db_url, tmp_path):
    app = SasApp(Settings(database_url=db_url, home=tmp_path / "home", broker_url="memory://localhost/"),
                 clock=VirtualClock())
    with pytest.raises(ValueError, match=r"needs a schema whose statement_timestamp\(\) reads sas.now"):
        app.store.now()
    app.store.dispose()


def test_a_database_that_is_not_postgresql_is_refused_by_name(tmp_path):
    app = SasApp(Settings(home=tmp_path / "home", broker_url="memory://localhost/"))
    with pytest.raises(ValueError, match=r"must be PostgreSQL .* not 'mysql'"):
        Environment(app, database_url="mysql://nobody@127.0.0.1/none")
