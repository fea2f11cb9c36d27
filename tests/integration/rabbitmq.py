"""RabbitMQ for the integration tests: a virtual host of each test's own on the broker at
SAS_TEST_RABBITMQ (scripts/test starts one), made and dropped with rabbitmqctl, and what a test
does to it (restart the broker's application; harness.rabbitmq_node.purge_queues empties its queues)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest
from kombu import Connection

RABBITMQ = os.environ.get("SAS_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672")


def rabbitmqctl(*args: str) -> str:
    """Run ``rabbitmqctl`` (Debian's, as root); fail the test loudly if it cannot."""
    tool = shutil.which("rabbitmqctl")
    if tool is None:
        pytest.fail("rabbitmqctl is missing: apt-get install rabbitmq-server (scripts/test does)", pytrace=False)
    done = subprocess.run([tool, "-q", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.fail(f"rabbitmqctl {' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}",
                    pytrace=False)
    return done.stdout


_swept = False


@contextmanager
def rabbitmq_vhost() -> Iterator[str]:
    """The URL of a fresh virtual host, deleted with everything in it afterwards (and, once a
    session, those an interrupted run left)."""
    global _swept
    # each pytest-xdist worker sweeps only its own leftovers, never a host another is using
    prefix = f"sas_t_{os.environ.get('PYTEST_XDIST_WORKER', 'gw0')}_"
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    try:
        with Connection(RABBITMQ, connect_timeout=5) as conn:
            conn.connect()
    except Exception as exc:
        pytest.fail(f"RabbitMQ at {RABBITMQ} is not answering ({exc}); scripts/test starts it", pytrace=False)
    if not _swept:
        for left in rabbitmqctl("list_vhosts", "name").split():
            if left.startswith(prefix):
                rabbitmqctl("delete_vhost", left)
        _swept = True
    rabbitmqctl("add_vhost", name)
    try:
        rabbitmqctl("set_permissions", "-p", name, urlsplit(RABBITMQ).username or "guest", ".*", ".*", ".*")
        yield f"{RABBITMQ}/{name}"
    finally:
        rabbitmqctl("delete_vhost", name)

