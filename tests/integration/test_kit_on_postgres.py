"""The test kit with its stores in the user's PostgreSQL: each environment in a schema of its own,
on its virtual clock, and nothing left behind."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
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


def test_a_database_that_never_answers_fails_the_environment_after_the_connect_timeout(tmp_path):
    """A test run pointed at a server that accepts the connection and never answers (a hung server,
    a proxy whose backend is gone) fails with the reason after libpq's ten seconds, rather than
    hanging the user's suite; run as a process, killed at 40 s if it hung."""
    make = ("from sas_app import SasApp, Settings\n"
            "from sas_app.testing import Environment\n"
            "import sys\n"
            f"app = SasApp(Settings(home={str(tmp_path / 'home')!r}, broker_url='memory://localhost/'))\n"
            "Environment(app, database_url=sys.argv[1])\n")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nothing ever answers
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", make, f"postgresql://sas@127.0.0.1:{silent.getsockname()[1]}/sas"],
                              capture_output=True, text=True, timeout=40)
        took = time.monotonic() - started
    assert done.returncode == 1
    assert "ValueError: cannot make a test schema" in done.stderr and "timeout expired" in done.stderr, done.stderr
    assert 9 < took < 30  # the store's default connect timeout, and the process's start
