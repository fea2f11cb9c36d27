"""The engine's unit tests, unchanged, on PostgreSQL (``db_url`` comes from this folder's conftest):
the same transitions, fencing, sweeps, compensation and operator actions, now with row locks and
SKIP LOCKED."""

from tests.unit.test_compensation import *  # noqa: F403
from tests.unit.test_engine import *  # noqa: F403
from tests.unit.test_operator import *  # noqa: F403
from tests.unit.test_security import test_every_value_reaches_the_store_as_a_bound_parameter  # noqa: F401
from tests.unit.test_submit import *  # noqa: F403
