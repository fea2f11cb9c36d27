"""Processes that die or misbehave in ways a restart does not cure: a poison step that kills every
worker it runs on, and workers whose clocks are wrong. Real Redis, PostgreSQL, worker and beat
processes; the store and the services' ledgers say what happened."""

from __future__ import annotations

import itertools
import re
import subprocess
import time
from collections import Counter
from datetime import datetime

import pytest
import redis

from harness.rabbitmq_node import RabbitNode
from tests.integration.conftest import shop_app
from tests.integration.stack import SAS, Stack, clock_off_by
from tests.support import wait_for

pytestmark = pytest.mark.integration


#: Celery's log lines for a worker's try to reach its broker: refused, or connected
TRIED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/MainProcess\] "
                   r"(consumer: Cannot connect to|Connected to) ", re.MULTILINE)
#: how long the broker stays down: Celery's own back-off (kombu's: 2 s, then each try 2 s longer)
#: would have the workers try at 2, 4, 8 and 14 s
BROKER_DOWN_S = 9.0


def back_since(stack, name: str, since: float) -> list[float]:
    """When the worker tried to reach its broker since ``since`` (epoch seconds), by its log, once
    the last try connected; [] before that."""
    tries = [(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp(), what)
             for stamp, what in TRIED.findall(stack.log(name))]
    tries = [(at, what) for at, what in tries if at >= since]
    return [at for at, _ in tries] if tries and tries[-1][1] == "Connected to" else []


def children_lost(stack, name: str) -> int:
    """How many of the worker's pool processes died (Celery logs each once, from its main process)."""
    return stack.log(name).count("Task handler raised error: WorkerLostError")


@pytest.mark.both_brokers
def test_a_poison_step_costs_max_failures_workers_then_the_order_is_undone(stack, stack_env):
    # A long complete-by: only the workers' reports of their lost children can recover the step.
    shop = shop_app(stack_env, charge_timeout=30, max_failures=3)
    shop.migrate()
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "poison"}}, business_key="poison-1")

    view = handle.wait(25)

    charge = view.step("charge_payment")
    assert view.process_state == "compensated"
    assert (charge.state, charge.attempt, charge.failure_count) == ("compensated", 3, 3)
    lost = [e for e in view.events if e.position == charge.position and e.kind == "transition"
            and e.detail and e.detail.get("reason") == "worker_lost"]
    assert [e.attempt for e in lost] == [1, 2]  # the third loss failed the step for good
    assert "lost its worker 3 times" in view.run.error
    # one worker process per attempt, no redelivery loop: exactly three children died
    wait_for(lambda: children_lost(stack, "agents") >= 3, 10, "the worker to log its lost children")
    assert children_lost(stack, "agents") == 3
    # the stock reserved before it is released; no charge was ever applied, and since nobody
    # knows whether a killed attempt got that far, the refund ran too and left a tombstone
    assert [e["action"] for e in stack.ledger("warehouse")] == ["reserve", "undo:reserve"]
    assert [(e["action"], e["undoes"]) for e in stack.ledger("payment")] == [("undo:charge", None)]
    # and the workers still serve
    assert shop.submit("order", {"amount": 6}, business_key="after-poison").wait(30).process_state == "processed"
    shop.store.dispose()


def test_workers_whose_clocks_are_a_minute_off_still_keep_every_deadline(stack, stack_env):
    # Agents run 60 s ahead, the Scheduler and the Supervisor's beat 60 s behind; the submitter and
    # the database are right. Deadlines are compared on the database's clock, so nothing expires
    # early (no failures on healthy orders) and nothing late (a hung charge is retried once its
    # complete-by passes on the database's clock, not a minute later).
    shop = shop_app(stack_env, charge_timeout=2.0)
    shop.migrate()
    stack.services(wait=False)
    stack.scheduler(env=clock_off_by(-60), wait=False)
    stack.agents(env=clock_off_by(+60), wait=False)
    stack.beat(env=clock_off_by(-60), wait=False)
    stack.wait_ready()
    healthy = [shop.submit("order", {"amount": 3 + i}, business_key=f"skew-{i}") for i in range(5)]
    hung = shop.submit("order", {"amount": 9, "faults": {"charge": "hang:30@1"}}, business_key="skew-hung")

    views = [h.wait(30) for h in healthy]
    hung_view = hung.wait(30)

    assert [(v.process_state, v.run.failure_count) for v in views] == [("processed", 0)] * 5
    assert hung_view.process_state == "processed"
    charge = hung_view.step("charge_payment")
    assert (charge.attempt, charge.failure_count) == (2, 1)
    [first] = [e for e in hung_view.events if e.position == charge.position and e.kind == "transition"
               and e.to_state == "running" and e.attempt == 1]
    [expired] = [e for e in hung_view.events if e.position == charge.position and e.from_state == "running"
                 and e.to_state == "pending"]
    deadline = first.detail["complete_by"]
    assert deadline <= expired.at < deadline + 5  # one sweep interval (0.5 s) and then some, not a minute
    assert len([e for e in stack.ledger("payment") if e["order_id"] == "skew-hung"]) == 1
    shop.store.dispose()


def test_redis_emptied_mid_run_loses_no_order(stack, shop, redis_url):
    # The stack's database number emptied, as a Redis restarted without persistence would be: every
    # queued and unacknowledged message goes, and kombu's routing table with them (FLUSHDB: the
    # other tests' numbers are left alone).
    stack.up()
    assert shop.submit("order", {"amount": 1}, business_key="before-flush").wait(30).process_state == "processed"
    in_flight = [shop.submit("order", {"amount": 2, "faults": {"charge": "latency:1"}}, business_key=f"flush-{i}")
                 for i in range(4)]
    wait_for(lambda: len(stack.requests_seen()) >= 2, 20, "charges to be in flight")

    redis.Redis.from_url(redis_url).flushdb()
    after = [shop.submit("order", {"amount": 3}, business_key=f"after-flush-{i}") for i in range(4)]

    views = [h.wait(60) for h in in_flight + after]
    assert [v.process_state for v in views] == ["processed"] * 8
    charges = Counter(e["order_id"] for e in stack.ledger() if e["action"] == "charge")
    assert set(charges.values()) == {1} and len(charges) == 9


@pytest.fixture
def own_rabbit(tmp_path):
    """A RabbitMQ node of this test's own (the others' is not restarted under them)."""
    (tmp_path / "logs").mkdir(exist_ok=True)
    node = RabbitNode(tmp_path)
    try:
        node.start()
        yield node
    finally:
        node.stop()


@pytest.mark.timeout(300)
def test_rabbitmq_restarted_and_its_queues_purged_mid_run_loses_no_order(own_rabbit, stack_env, tmp_path):
    """Where the Redis run empties Redis: RabbitMQ's application restarted (every connection
    dropped, what was unacknowledged given back), then every queue purged (a node of the test's own).
    The broker stays down 9 s, and the workers try to reach it at most about a second apart. Each step
    may pass its complete-by 10 times: an order undone because nobody took its step meanwhile would
    be right, but not what this looks at."""
    stack_env = {**stack_env, "SAS_BROKER_URL": own_rabbit.url}
    shop = shop_app(stack_env, max_failures=10)
    shop.migrate()
    stack = Stack(tmp_path / "home", stack_env)
    try:
        rabbit_restarted_mid_run(own_rabbit, stack, shop)
    finally:
        stack.stop_all()
        shop.store.dispose()


def rabbit_restarted_mid_run(node: RabbitNode, stack: Stack, shop) -> None:
    stack.up()
    assert shop.submit("order", {"amount": 1}, business_key="before").wait(30).process_state == "processed"
    in_flight = [shop.submit("order", {"amount": 2, "faults": {"charge": "latency:1"}}, business_key=f"mid-{i}")
                 for i in range(4)]
    wait_for(lambda: len(stack.requests_seen()) >= 2, 20, "charges to be in flight")

    node.ctl("stop_app")
    down_at, down_since = time.monotonic(), time.time()
    try:
        late = [shop.submit("order", {"amount": 3}, business_key=f"while-down-{i}") for i in range(2)]
        time.sleep(max(0.0, down_at + BROKER_DOWN_S - time.monotonic()))  # the outage's length, not a wait
    finally:
        node.ctl("start_app")
    node.ctl("await_startup")
    # every worker tried to reach the broker at most about a second apart (sas_app.messaging.reconnect), so it
    # was back within a second of the broker, not after Celery's back-off
    for name in ("agents", "scheduler"):
        tries = wait_for(lambda name=name: back_since(stack, name, down_since), 10, f"{name} back on the broker")
        gaps = [later - earlier for earlier, later in itertools.pairwise(tries)]
        assert len(tries) >= 6 and max(gaps) <= 1.5, f"{name} tried the broker at {tries}"
    node.purge()
    after = [shop.submit("order", {"amount": 4}, business_key=f"after-{i}") for i in range(3)]

    views = [h.wait(90) for h in in_flight + late + after]
    assert [v.process_state for v in views] == ["processed"] * 9
    charges = Counter(e["order_id"] for e in stack.ledger() if e["action"] == "charge")
    assert set(charges.values()) == {1} and len(charges) == 10


def test_a_run_resumed_while_the_scheduler_is_down_ends_though_the_broker_lost_the_resume(stack, shop, redis_url):
    """As an operator met it: a run paused while its first step ran; once that step completed, the
    Scheduler's worker stopped, the run resumed (``sas resume``), the broker's database emptied —
    the resume's message with it — and the Scheduler's worker started again. The run asked about
    has a complete-by of its own: the Supervisor finds it and the run ends processed."""
    stack.up()
    handle = shop.submit("order", {"amount": 4, "faults": {"reserve": "latency:2"}}, business_key="resumed")
    # paused at once, while its first step runs (a sas process might start after the 2 s it takes)
    shop.pause(handle.id, by="ops", reason="check the stock")
    wait_for(lambda: {s.state for s in handle.status().steps if s.name in ("reserve_stock", "fraud_check")}
             == {"completed"}, 30, "the steps under way to complete")
    stack.kill("scheduler")
    assert [s.state for s in handle.status().steps][2:] == ["not_started"] * 3

    resumed = subprocess.run([SAS, "resume", handle.id, "--by", "ops", "--reason", "stock is fine"], env=stack.env,
                             timeout=60, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    redis.Redis.from_url(redis_url).flushdb()  # the resume's message lost, as a failover would lose it
    stack.scheduler()

    view = handle.wait(60)
    assert view.process_state == "processed"
    asked = [e for e in view.events if e.kind == "requeue" and e.position is None]
    assert [(e.from_state, e.to_state) for e in asked] == [("processing", "processing")]
    assert [e["order_id"] for e in stack.ledger() if e["action"] == "charge"] == ["resumed"]
