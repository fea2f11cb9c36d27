"""Integration fixtures: a fresh PostgreSQL database and Redis database number (or RabbitMQ
virtual host) per test, and the real processes. A service that does not answer fails the tests
loudly; nothing is skipped. A test marked ``both_brokers`` runs on Redis and on RabbitMQ; one
marked ``pgbouncer_too`` runs with PostgreSQL reached directly and through PgBouncer."""

from __future__ import annotations

import itertools
import os

import pytest
import redis

from harness.pgbouncer import pgbouncer, through
from sas_app import SasApp, Settings, fault_points
from tests.conftest import POSTGRES, fresh_postgres_database
from tests.integration.graph_app import install as install_graph_app
from tests.integration.rabbitmq import rabbitmq_vhost
from tests.integration.stack import Stack, free_port
from workers.orders import install

REDIS = os.environ.get("SAS_TEST_REDIS", "redis://127.0.0.1:6379")


def _own_redis_numbers() -> itertools.cycle[int]:
    """Redis's database numbers 1-11, shared out between the pytest-xdist workers: each test
    empties the one it takes, never one another worker's test is using (12-15 are the benches')."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 11:
        raise pytest.UsageError(f"-n {workers}: the integration tests share Redis's database numbers 1-11 "
                                "between their workers; run at most 11")
    return itertools.cycle(range(1 + worker, 12, workers))


_redis_numbers = _own_redis_numbers()


@pytest.fixture
def db_url(postgres_admin, pooler, request):
    """A fresh PostgreSQL database for this test (overrides the unit tests' SQLite), reached
    directly or, on a ``pgbouncer_too`` test's second turn, through PgBouncer in transaction mode."""
    with fresh_postgres_database(postgres_admin) as url:
        yield url if pooler == "direct" else through(url, request.getfixturevalue("pgbouncer_port"))


@pytest.fixture
def pooler(request):
    """How the stack reaches PostgreSQL: directly, unless the test runs through PgBouncer too and this is its turn."""
    return getattr(request, "param", "direct")


@pytest.fixture(scope="session")
def pgbouncer_port():
    try:
        with pgbouncer(POSTGRES) as port:
            yield port
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def redis_url():
    """A Redis database number of this test's own, emptied first."""
    url = f"{REDIS}/{next(_redis_numbers)}"
    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis at {REDIS} is not answering ({exc}); scripts/test starts it", pytrace=False)
    finally:
        client.close()
    return url


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    brokers = ["redis", "rabbitmq"] if metafunc.definition.get_closest_marker("both_brokers") else ["redis"]
    poolers = ["direct", "pgbouncer"] if metafunc.definition.get_closest_marker("pgbouncer_too") else ["direct"]
    if len(brokers) + len(poolers) > 2:  # each broker directly, and PgBouncer on Redis
        turns = [(b, "direct") for b in brokers] + [("redis", p) for p in poolers[1:]]
        metafunc.parametrize(("broker", "pooler"), turns, indirect=True,
                             ids=[b if p == "direct" else p for b, p in turns])


@pytest.fixture
def broker(request):
    """Which broker the stack runs on: Redis, unless the test runs on both and this is RabbitMQ's turn."""
    return getattr(request, "param", "redis")


@pytest.fixture
def broker_url(broker, request):
    if broker == "redis":
        yield request.getfixturevalue("redis_url")
        return
    with rabbitmq_vhost() as url:
        yield url


@pytest.fixture
def stack_env(db_url, broker_url, pooler, tmp_path):
    # behind PgBouncer (before 1.21) a session's prepared statements do not follow it: the README says so
    pooled = {"SAS_PREPARED_STATEMENTS": "false"} if pooler == "pgbouncer" else {}
    return {
        **pooled,
        "SAS_DATABASE_URL": db_url,
        "SAS_BROKER_URL": broker_url,
        "SAS_HOME": str(tmp_path / "home"),
        "SAS_SUPERVISOR_INTERVAL": "0.5",
        "SAS_PICKUP_TIMEOUT": "2",
        "SAS_RETRY_BACKOFF": "0.2",
        "SAS_RETRY_BACKOFF_MAX": "1",
        "SAS_VISIBILITY_TIMEOUT": "120",
        "SAS_TASK_EVENTS": "false",
        "PAYMENT_SERVICE_URL": f"http://127.0.0.1:{free_port()}",
        "WAREHOUSE_SERVICE_URL": f"http://127.0.0.1:{free_port()}",
        "ALERT_FILE": str(tmp_path / "alerts.jsonl"),
        "SAS_ALERT_HOOK": "tests.integration.alert_sink:record",
    }


@pytest.fixture
def stack(stack_env, tmp_path, request):
    home = tmp_path / "home"
    home.mkdir()
    s = Stack(home, stack_env)
    yield s
    s.stop_all()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        for name in s.argv:
            print(f"===== {name} =====\n{s.tail(name, 80)}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def submitter(stack_env) -> SasApp:
    """The submitting side, in the test process: the workers' settings (its alerts are theirs to hook)."""
    return SasApp(Settings.from_env({k: v for k, v in stack_env.items() if k != "SAS_ALERT_HOOK"}))


def shop_app(stack_env, charge_timeout: float = 2.0, max_failures: int = 3, step_timeout: float = 10.0) -> SasApp:
    """The order example's submitting side. (Timeouts are written into each run's steps at submit,
    so the workers follow the submitter's.)"""
    app = submitter(stack_env)
    install(app, charge_timeout=charge_timeout, max_failures=max_failures, step_timeout=step_timeout)
    return app


def submit_unsent(shop: SasApp, key: str, amount: float = 3):
    """Submit an order whose process dies (a fault) right after its transaction commits, before
    it sends anything; the run as the store then holds it."""
    fault_points.arm("submit.after_commit=raise", shop.settings.home)
    try:
        with pytest.raises(fault_points.FaultInjected):
            shop.submit("order", {"amount": amount}, business_key=key)
    finally:
        fault_points.arm("")
    return shop.store.find_run("order", key)


@pytest.fixture
def shop(stack_env):
    app = shop_app(stack_env)
    app.migrate()
    yield app
    app.store.dispose()


@pytest.fixture
def app(stack_env):
    """The submitting side of tests/integration/graph_app.py: the same workflows and settings as
    its workers."""
    sas = submitter(stack_env)
    install_graph_app(sas)
    sas.migrate()
    yield sas
    sas.store.dispose()
