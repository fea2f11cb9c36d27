"""Agents protect their services: a shared circuit breaker, and urgent runs first."""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.stack import SAS
from tests.support import wait_for

pytestmark = pytest.mark.integration


def deferrals(shop, handle, position=0):
    return [e for e in shop.store.get_events(handle.id)
            if e.kind == "transition" and e.position == position and e.detail and "deferred" in e.detail]


def faults_of(shop, handle, position=0):
    return [e.detail for e in shop.store.get_events(handle.id) if e.kind == "faults" and e.position == position]


@pytest.mark.both_brokers
def test_one_step_retried_in_process_leaves_the_breaker_closed_for_everyone(stack, shop):
    stack.env.update({"SAS_BREAKER_FAIL_MAX": "3", "SAS_BREAKER_RESET": "3"})
    stack.up()
    flaky = shop.submit("order", {"amount": 1, "faults": {"reserve": "transient:5"}}, business_key="f-0")
    others = [shop.submit("order", {"amount": 1}, business_key=f"f-{i}") for i in range(1, 4)]

    views = [h.wait(40) for h in [flaky, *others]]

    assert [v.process_state for v in views] == ["processed"] * 4
    assert [v.step("reserve_stock").attempt for v in views] == [1] * 4, "one attempt each, retried in-process"
    assert not any(deferrals(shop, h) for h in [flaky, *others]), "the breaker never opened"
    assert stack.requests_seen("warehouse")[f"{flaky.id}:reserve_stock"] == 6
    # the fault's own words are kept on the attempt's history: how many, the first and the last
    [kept] = faults_of(shop, flaky)
    assert kept["count"] == 5 and kept["first"] == "warehouse answered 503: service unavailable (injected)"
    assert kept["last"] == [kept["first"]] * 3
    shown = subprocess.run([SAS, "show", flaky.id], env=stack.env, capture_output=True, text=True, timeout=60)
    assert "5 transient faults: warehouse answered 503: service unavailable (injected)" in shown.stdout
    # and the agent worker's log said each at INFO, with its try number
    log = stack.log("agents")
    assert f"run {flaky.id} step reserve_stock attempt 1 try 5: transient fault: warehouse answered 503" in log


@pytest.mark.both_brokers
def test_a_service_down_for_everyone_opens_the_breaker_at_its_threshold_of_calls(stack, shop):
    stack.env.update({"SAS_BREAKER_FAIL_MAX": "3", "SAS_BREAKER_RESET": "3"})
    stack.services()
    stack.set_faults("warehouse", {"down": 1.0})
    stack.scheduler(wait=False)
    stack.beat(wait=False)
    stack.agents(concurrency=4, wait=False)
    stack.wait_ready()
    handles = [shop.submit("order", {"amount": 1}, business_key=f"d-{i}") for i in range(10)]
    wait_for(lambda: sum(bool(deferrals(shop, h)) for h in handles) == 10, 40,
             "every reservation deferred by the open breaker")
    opened = min(d.at for h in handles for d in deferrals(shop, h))

    # the third distinct reservation to fail opened it, as three failed calls in a row always did
    # (with four pool processes, at most three more were under way); the rest were deferred
    # without reaching the service
    assert 3 <= len(stack.requests_seen("warehouse")) <= 3 + 3
    stack.set_faults("warehouse", {})
    views = [h.wait(40) for h in handles]
    assert [v.process_state for v in views] == ["processed"] * 10
    assert [v.step("reserve_stock").failure_count for v in views] == [0] * 10, "a deferral burns no budget"
    reserved_at = [e["at"] for e in stack.ledger("warehouse") if e["action"] == "reserve"]
    # The first deferral is written once the call that opened the breaker has come back and its
    # reply committed: later than the opening by that (tens of milliseconds, more on a loaded
    # machine). A reservation let through while the breaker was open would come seconds early.
    assert min(reserved_at) >= opened + 3 - 0.5, "a reservation went through while the breaker was open"


@pytest.mark.both_brokers
def test_an_urgent_run_overtakes_queued_ones_on_the_agent_queue(stack, shop):
    stack.services(wait=False)
    stack.scheduler(wait=False)
    stack.beat(wait=False)
    stack.wait_ready()
    slow = [shop.submit("order", {"amount": 1}, business_key=f"slow-{i}", priority=1) for i in range(4)]
    urgent = shop.submit("order", {"amount": 1}, business_key="urgent", priority=9)
    wait_for(lambda: all(h.status().step("reserve_stock").state == "running" for h in [*slow, urgent]), 20,
             "every reservation to wait on the warehouse queue")

    stack.agents(concurrency=1)
    views = {h.id: h.wait(40) for h in [*slow, urgent]}

    first = min(views.values(), key=lambda v: v.step("reserve_stock").completed_at)
    assert first.id == urgent.id


@pytest.mark.both_brokers
def test_an_agent_rate_limit_holds_across_every_worker(stack, shop):
    """Two agent workers of three processes each share the warehouse's 4 calls a second (in Redis,
    or in PostgreSQL beside RabbitMQ): six processes that could call at once are spaced out so that
    the service never sees more than the limit in a second."""
    stack.env["SAS_AGENT_RATE_LIMITS"] = "warehouse=4/s"
    stack.services(wait=False)
    stack.scheduler(wait=False)
    stack.beat(wait=False)
    stack.agents(name="agents-a", concurrency=3, wait=False)
    stack.agents(name="agents-b", concurrency=3, wait=False)
    stack.wait_ready()
    handles = [shop.submit("order", {"amount": 1}, business_key=f"rl-{i}") for i in range(12)]

    views = [h.wait(60) for h in handles]

    assert [v.process_state for v in views] == ["processed"] * 12
    assert all(v.step("reserve_stock").failure_count == 0 for v in views)
    reserved = sorted(e["at"] for e in stack.ledger("warehouse") if e["action"] == "reserve")
    assert len(reserved) == 12
    # Slots a quarter second apart. The service sees each call a moment after its slot — a few
    # tenths of a second for a pool process's first call (its connection, on a busy host) — so two
    # seconds hold the limit's 8 calls and two late ones at most; a limit per worker (Celery's)
    # lets these 12 through in a second and a half, none at all within a half.
    offsets = [round(t - reserved[0], 3) for t in reserved]
    assert max(sum(1 for t in reserved if start <= t < start + 2) for start in reserved) <= 10, offsets
    assert reserved[-1] - reserved[0] >= 2.0, offsets
