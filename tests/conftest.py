from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, create_engine, text

from sas_app import SasApp, Settings
from tests.support import FakeClock, Pump
from tests.testapp import install_test_workflows

POSTGRES = os.environ.get("SAS_TEST_POSTGRES", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``both_stores`` runs on SQLite and, as an integration test, on PostgreSQL
    (row locks, SKIP LOCKED, the one-statement hot path): the same assertions on both."""
    if metafunc.definition.get_closest_marker("both_stores") and "db_url" in metafunc.fixturenames:
        metafunc.parametrize("db_url", ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)],
                             indirect=True)


@pytest.fixture(autouse=True)
def alone_when_marked(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """scripts/test runs two tests at once (pytest-xdist; SAS_TEST_WORKERS=0: one at a time): a test marked
    ``alone`` runs while no other does, as it changes what every test shares (restarts RabbitMQ,
    empties all of Redis) or counts it (the benches read Redis's command counts). A readers-writer lock between the
    workers, its files in their common temporary folder; a turnstile first, so that a test
    waiting to run alone is not passed by the other worker's next tests."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    shared = tmp_path_factory.getbasetemp().parent
    alone = request.node.get_closest_marker("alone") is not None
    with open(shared / "turnstile.lock", "a") as turnstile, open(shared / "alone.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
def sas(settings):
    # On SQLite the store's clock is injected: expiries are a step forward (tests.support.expire).
    clock = FakeClock() if settings.database_url.startswith("sqlite") else None
    app = SasApp(settings, clock=clock)
    app.test_clock = clock
    # On PostgreSQL the steps' complete-by runs on the server's real clock: 1 s, not the default
    # 0.3 s, so a step a slow machine delivers a few hundred ms late is not expired on arrival
    install_test_workflows(app, timeout=0.3 if clock else 1.0)
    app.migrate()
    Pump(app).purge()  # the memory transport is shared by every app in this process
    yield app
    app.store.dispose()


@pytest.fixture
def pump(sas) -> Pump:
    return Pump(sas)
