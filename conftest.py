"""What every test of the repository shares: its tier, and running alone when it must.

The tiers: ``unit`` (this process only: the test kit, no server, no subprocess — every test not
marked otherwise), ``integration`` (real processes or servers: Celery workers and beat, the ``sas``
command, PostgreSQL, Redis, RabbitMQ), ``chaos`` (the chaos run, CI-sized) and ``bench`` (the
benchmarks' own tests, bench/tests). ``pytest -m unit`` runs the first alone.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator

import pytest

TIERS = ("integration", "chaos", "bench")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def alone_when_marked(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """scripts/test runs three tests at once (pytest-xdist; SAS_TEST_WORKERS=0: one at a time): a test marked
    ``alone`` runs while no other does, as it changes what every test shares (restarts RabbitMQ,
    empties all of Redis); one marked ``one_bench(name)`` while no other of that bench does, as a
    bench's stack takes fixed database names. A readers-writer lock
    between the workers, its files in their common temporary folder; a turnstile first, so that a test
    waiting to run alone is not passed by the other workers' next tests."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    shared = tmp_path_factory.getbasetemp().parent
    alone = request.node.get_closest_marker("alone") is not None
    one_bench = request.node.get_closest_marker("one_bench")
    bench_name = one_bench.args[0] if one_bench is not None and one_bench.args else "bench"
    with open(shared / "turnstile.lock", "a") as turnstile, open(shared / "alone.lock", "a") as lock, \
            open(shared / f"bench-{bench_name}.lock", "a") as bench:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if one_bench:
            fcntl.flock(bench, fcntl.LOCK_EX)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(bench, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_UN)
