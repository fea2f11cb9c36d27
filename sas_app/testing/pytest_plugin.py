"""sas_app's pytest plugin, active wherever sas_app is installed (its ``pytest11`` entry point):
the ``sas_env`` fixture.

>>> def test_an_order_is_charged_once(sas_env):
...     env = sas_env(sas)                      # your SasApp
...     view = env.run(orders, {"amount": 5})
...     assert view.state is RunState.PROCESSED
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sas_app.app import SasApp
from sas_app.testing.environment import Environment


@pytest.fixture
def sas_env() -> Iterator[Callable[..., Environment]]:
    """Makes a test :class:`Environment` for your app: ``env = sas_env(sas)`` (options as
    :class:`Environment`'s); each is closed when the test ends."""
    made: list[Environment] = []

    def make(app: SasApp, **options: Any) -> Environment:
        env = Environment(app, **options)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()
