"""Agents protect their services: a shared circuit breaker, and urgent runs first."""

from __future__ import annotations

import time

import pytest

from tests.support import wait_for

pytestmark = pytest.mark.integration


def deferrals(shop, handle, position=0):
    return [e for e in shop.store.get_events(handle.id)
            if e.kind == "transition" and e.position == position and e.detail and "deferred" in e.detail]


@pytest.mark.both_brokers
def test_with_the_breaker_open_no_request_reaches_the_service_and_no_budget_burns(stack, shop):
    stack.env.update({"SAS_BREAKER_FAIL_MAX": "3", "SAS_BREAKER_RESET": "3"})
    stack.up()
    failing = shop.submit("order", {"amount": 1, "faults": {"reserve": "transient:3"}}, business_key="b-0")
    wait_for(lambda: deferrals(shop, failing), 20, "the breaker to open on the third failure")
    opened = deferrals(shop, failing)[0].at

    others = [shop.submit("order", {"amount": 1}, business_key=f"b-{i}") for i in range(1, 4)]
    views = [h.wait(40) for h in [failing, *others]]

    assert [v.process_state for v in views] == ["processed"] * 4
    assert [v.step("reserve_stock").failure_count for v in views] == [0] * 4
    assert all(deferrals(shop, h) for h in others), "each was deferred, not called, while open"
    seen = stack.requests_seen("warehouse")
    assert [seen[f"{h.id}:reserve_stock"] for h in [failing, *others]] == [4, 1, 1, 1]
    reserved_at = [e["at"] for e in stack.ledger("warehouse") if e["action"] == "reserve"]
    assert min(reserved_at) >= opened + 3 - 0.05, "a reservation went through while the breaker was open"


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


def test_an_agent_rate_limit_spaces_out_its_calls(stack, shop):
    stack.env["SAS_AGENT_RATE_LIMITS"] = "warehouse=2/s"
    stack.services(wait=False)
    stack.scheduler(wait=False)
    stack.beat(wait=False)
    stack.wait_ready()
    handles = [shop.submit("order", {"amount": 1}, business_key=f"rl-{i}") for i in range(6)]
    stack.agents(concurrency=4)
    ready_at = time.time()  # the worker consumes from here on (its ready file is read every 50 ms)

    views = [h.wait(60) for h in handles]

    assert [v.process_state for v in views] == ["processed"] * 6
    reserved = sorted(e["at"] for e in stack.ledger("warehouse") if e["action"] == "reserve")
    # 6 reservations at 2 per second (a token bucket starting full with one) are let through over
    # 2.5 s from the worker's start, the last no sooner, where 4 free slots would have done them all
    # within a pool process's first call (its connection, imports: a second on a busy host). Timed
    # from the start, not from the first call, which may itself reach the service a second late.
    assert reserved[-1] - ready_at >= 2.0
