"""Past its capacity a fleet is slow, not failing: one agent worker process for every agent, orders
whose charges take longer together than a step's timeout (3 s; 4 s a charge). The steps behind them wait in the queue
past their complete-by; the Supervisor leaves them there (their messages are still queued), the
worker starts each when it gets to it, and every order is processed with one attempt per step and
one request per charge — where counting the wait as failures would retry steps behind their own
messages and undo orders whose services were never called. (On Redis; the unit tests cover the
Supervisor's judgement on both stores.)"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from sas_app.states import EventKind
from sas_app.store.tables import events
from tests.integration.conftest import shop_app

pytestmark = pytest.mark.integration

CHARGE_TIMEOUT = 4.0  # a charge itself takes 1.5 s, and the fraud checks' calls share its service
LATENCY = 1.5
ORDERS = 8  # their charges take 12 s one after another: the steps behind them wait past their timeouts


def test_steps_waiting_in_a_backed_up_queue_past_complete_by_spend_no_attempt(stack, stack_env):
    shop = shop_app(stack_env, charge_timeout=CHARGE_TIMEOUT, step_timeout=3.0, max_failures=2)
    shop.migrate()
    stack.services()
    stack.scheduler(wait=False)
    stack.agents(concurrency=1, wait=False)
    stack.beat(wait=False)
    stack.wait_ready()
    handles = [shop.submit("order", {"amount": 3 + i, "faults": {"charge": f"latency:{LATENCY}"}},
                           business_key=f"busy-{i}") for i in range(ORDERS)]

    views = [h.wait(90) for h in handles]
    assert [v.process_state for v in views] == ["processed"] * ORDERS
    ran = [s for v in views for s in v.steps if s.attempt]
    assert {(s.attempt, s.failure_count) for s in ran} == {(1, 0)}, "a step spent an attempt waiting"
    seen = stack.requests_seen()
    assert [seen[f"{h.id}:charge_payment"] for h in handles] == [1] * ORDERS
    with shop.store.engine.connect() as conn:
        started_late = conn.execute(select(events.c.run_id, events.c.position).where(
            events.c.kind == EventKind.QUEUED.value, events.c.detail["started_late"].is_not(None))).all()
    assert len(started_late) >= 2, "steps waited in their queue past their complete-by: the test's premise"
    shop.store.dispose()
