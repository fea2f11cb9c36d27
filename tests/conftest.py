from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, create_engine, text

from sas_app import SasApp, Settings
from sas_app.testing import Environment
from tests.support import FakeClock, Pump
from tests.testapp import install_test_workflows

POSTGRES = os.environ.get("SAS_TEST_POSTGRES", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``both_stores`` runs on SQLite and, as an integration test, on PostgreSQL
    (row locks, SKIP LOCKED, the one-statement hot path): the same assertions on both."""
    if metafunc.definition.get_closest_marker("both_stores") and "db_url" in metafunc.fixturenames:
        metafunc.parametrize("db_url", ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)],
                             indirect=True)


@pytest.fixture(scope="session")
def postgres_admin() -> Iterator[Engine]:
    engine = create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        pytest.fail(f"PostgreSQL at {POSTGRES} is not answering ({exc}); scripts/test starts it", pytrace=False)
    yield engine
    engine.dispose()


@contextmanager
def fresh_postgres_database(admin: Engine) -> Iterator[str]:
    """A PostgreSQL database of this test's own, dropped afterwards."""
    name = f"sas_t_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """The state store under test: SQLite, unless the test runs on both stores and this is its
    PostgreSQL turn (tests/integration overrides it with PostgreSQL for every test)."""
    if getattr(request, "param", "sqlite") == "postgresql":
        with fresh_postgres_database(request.getfixturevalue("postgres_admin")) as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
def settings(db_url, tmp_path) -> Settings:
    return Settings(
        database_url=db_url,
        broker_url="memory://localhost/",
        home=tmp_path / "home",
        pickup_timeout=0.3,
        retry_backoff=0.05,
        retry_backoff_max=0.2,
        supervisor_interval=0.2,
        at_risk_interval=0.01,  # a thirtieth of the test workflows' 0.3 s steps
        task_events=False,
        # Replies travel as messages here, so tests can hold, repeat and reorder them; the
        # in-process path is what the integration tests' workers use.
        inline_replies=False,
    )


@pytest.fixture
def env(settings: Settings, db_url: str) -> Iterator[Environment]:
    """The engine tests run on the test kit users have (:class:`Environment`): an app with the test
    workflows (tests/testapp.py), on a clock the test moves, in SQLite or — on a ``both_stores``
    test's PostgreSQL turn — a schema of its own in PostgreSQL, its messages run by the test."""
    user = SasApp(settings)
    install_test_workflows(user)
    with Environment(user, clock=FakeClock(), database_url=None if db_url.startswith("sqlite") else db_url) as env:
        env.app.test_clock = env.clock  # type: ignore[attr-defined]
        yield env


@pytest.fixture
def sas(env: Environment) -> SasApp:
    return env.app


@pytest.fixture
def pump(env: Environment) -> Pump:
    return env.pump
