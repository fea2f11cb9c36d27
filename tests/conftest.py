from __future__ import annotations

import pytest

from sas_app import SasApp, Settings
from tests.support import Pump
from tests.testapp import install_test_workflows


@pytest.fixture
def db_url(tmp_path) -> str:
    """The state store under test. Unit tests use SQLite; tests/integration overrides it with a
    fresh PostgreSQL database per test."""
    return f"sqlite:///{tmp_path / 'state.db'}"


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
        task_events=False,
        # Replies travel as messages here, so tests can hold, repeat and reorder them; the
        # in-process path is what the integration tests' workers use.
        inline_replies=False,
    )


@pytest.fixture
def sas(settings):
    app = SasApp(settings)
    install_test_workflows(app)
    app.migrate()
    Pump(app).purge()  # the memory transport is shared by every app in this process
    yield app
    app.store.dispose()


@pytest.fixture
def pump(sas) -> Pump:
    return Pump(sas)
