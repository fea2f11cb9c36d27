"""sas_app's pytest plugin, active wherever sas_app is installed (its ``pytest11`` entry point):
the ``sas_env`` fixture, and ``--sas-database-url`` (or ``SAS_TEST_DATABASE_URL``): a PostgreSQL
database the environments keep their stores in, each in a schema of its own, instead of SQLite.

>>> def test_an_order_is_charged_once(sas_env):
...     env = sas_env(sas)                      # your SasApp
...     view = env.run(orders, {"amount": 5})
...     assert view.state is RunState.PROCESSED
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sas_app.app import SasApp
from sas_app.testing.environment import Environment


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("sas_app").addoption(
        "--sas-database-url", default=os.environ.get("SAS_TEST_DATABASE_URL", ""),
        help="PostgreSQL database for sas_env's stores, a schema each (default: SAS_TEST_DATABASE_URL, or SQLite)")


@pytest.fixture
def sas_env(request: pytest.FixtureRequest) -> Iterator[Callable[..., Environment]]:
    """Makes a test :class:`Environment` for your app: ``env = sas_env(sas)`` (options as
    :class:`Environment`'s); each is closed when the test ends."""
    made: list[Environment] = []
    database_url = request.config.getoption("sas_database_url") or None

    def make(app: SasApp, **options: Any) -> Environment:
        env = Environment(app, **{"database_url": database_url, **options})
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()
