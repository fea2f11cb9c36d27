"""TLS end to end: a Redis, a RabbitMQ and a PostgreSQL of the test's own that speak only TLS, with
a certificate from an authority the test makes; a real worker on each broker, PostgreSQL reached
with ``sslmode=verify-full``; a run processed on each. What does not verify is refused."""

from __future__ import annotations

import os

import pytest
import redis
from kombu import Connection
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from harness.rabbitmq_node import RabbitNode
from harness.servers import Servers
from harness.tls import make_tls
from sas_app import SasApp, Settings
from sas_app.messaging.celery_config import broker_tls
from sas_app.testing.processes import Processes
from tests.integration.graph_app import install as install_graph_app
from tests.integration.stack import CHECKOUT_PATH, REPO

pytestmark = pytest.mark.integration


@pytest.fixture
def servers(tmp_path):
    """Redis, PostgreSQL and RabbitMQ, TLS only, and the authority their certificate is from."""
    (tmp_path / "logs").mkdir()
    tls = make_tls(tmp_path / "tls")
    own = Servers(tmp_path, tls)
    rabbit = RabbitNode(tmp_path, tls)
    try:
        own.start_redis()
        own.init_postgres()
        rabbit.start()
        yield own, rabbit, tls
    finally:
        rabbit.stop()
        own.stop()


def test_a_run_is_processed_over_tls_on_redis_and_on_rabbitmq_with_postgresql_verified(servers, tmp_path):
    own, rabbit, tls = servers
    # the servers take nothing without TLS
    with pytest.raises(redis.ConnectionError):
        redis.Redis(port=own.redis_port, password=own.redis_password, socket_timeout=2).ping()
    plain = create_engine(own.database_url.split("?")[0] + "?sslmode=disable")
    with pytest.raises(OperationalError, match="no encryption"):
        plain.connect()
    plain.dispose()

    for broker in (own.redis_url, rabbit.url):
        scheme = broker.split(":")[0]
        (tmp_path / scheme).mkdir()
        env = {**os.environ, "SAS_APP": "tests.integration.graph_app:sas", "PYTHONPATH": CHECKOUT_PATH,
               "SAS_DATABASE_URL": own.database_url, "SAS_BROKER_URL": broker, "SAS_BROKER_CA_FILE": str(tls.ca),
               "SAS_HOME": str(tmp_path / scheme), "SAS_SUPERVISOR_INTERVAL": "0.5"}
        app = SasApp(Settings.from_env(env))
        install_graph_app(app)
        app.migrate()
        procs = Processes(tmp_path / f"procs-{scheme}", env, cwd=REPO)
        try:
            procs.worker("all", "sas.scheduler,sas.supervisor,sas.agent.work", 2)
            handle = app.submit("three_at_once", {}, business_key=f"over-{scheme}")
            assert handle.wait(60).process_state == "processed", procs.tail("all")
        finally:
            procs.stop_all(grace=0)
            app.store.dispose()

    # an app that trusts another authority is refused by each broker, with the options it gives Celery
    stranger = make_tls(tmp_path / "stranger")
    for broker in (own.redis_url, rabbit.url):
        settings = Settings(home=tmp_path / "stranger-home", broker_url=broker, broker_ca_file=str(stranger.ca))
        with Connection(broker, ssl=broker_tls(settings), connect_timeout=5) as conn, \
                pytest.raises(Exception, match="certificate verify failed"):
            conn.ensure_connection(max_retries=0)
    wrong = create_engine(own.database_url.replace(str(tls.ca), str(stranger.ca)))
    with pytest.raises(OperationalError, match="certificate verify failed"):
        wrong.connect()
    wrong.dispose()
    with own.redis_client() as client:
        assert client.ping()
    with create_engine(own.admin_url).connect() as conn:
        assert conn.execute(text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")).scalar_one() is True
