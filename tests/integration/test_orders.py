"""The order example on the real stack: Redis, PostgreSQL, the payment service, Celery worker and
beat processes. Each test states the fault, the action, and what the store and the ledger hold."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from sqlalchemy import select

from sas_app import faults
from tests.integration.conftest import shop_app
from tests.support import wait_for
from workers.orders import orders

pytestmark = pytest.mark.integration


def charges_for(stack, handle) -> list[dict]:
    return [e for e in stack.ledger() if e["idempotency_key"] == f"{handle.id}:charge_payment"]


def alerts_written(stack_env) -> list[dict]:
    path = Path(stack_env["ALERT_FILE"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_happy_path_every_order_processed_and_charged_once(stack, shop):
    stack.up()
    handles = [shop.submit("order", {"amount": 10 + i}, business_key=f"ord-{i}") for i in range(10)]

    views = [h.wait(30) for h in handles]

    assert [v.process_state for v in views] == ["processed"] * 10
    ledger = stack.ledger()
    assert sorted(e["order_id"] for e in ledger) == sorted(f"ord-{i}" for i in range(10))
    assert len({e["idempotency_key"] for e in ledger}) == 10
    with shop.store.engine.connect() as conn:
        statuses = conn.execute(select(orders.c.status, orders.c.charge_id)).all()
    assert {s for s, _ in statuses} == {"paid"} and all(c.startswith("ch_") for _, c in statuses)


def test_a_transient_fault_is_retried_inside_the_agent(stack, shop):
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "transient:2"}}, business_key="t-1")

    view = handle.wait(30)

    assert view.process_state == "processed"
    charge = view.step("charge_payment")
    assert (charge.attempt, charge.failure_count) == (1, 0)
    assert stack.requests_seen()[f"{handle.id}:charge_payment"] == 3
    assert len(charges_for(stack, handle)) == 1


def test_an_agent_that_hangs_past_complete_by_is_recovered_by_the_supervisor(stack, shop):
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "hang:30@1"}}, business_key="h-1")

    view = handle.wait(30)

    assert view.process_state == "processed"
    charge = view.step("charge_payment")
    assert (charge.attempt, charge.failure_count, view.run.failure_count) == (2, 1, 1)
    assert len(charges_for(stack, handle)) == 1


def test_an_agent_worker_killed_mid_step_is_recovered_and_charges_once(stack, stack_env):
    shop = shop_app(stack_env, charge_timeout=4.0)
    shop.migrate()
    stack.up()
    handle = shop.submit("order", {"amount": 7, "faults": {"charge": "latency:2"}}, business_key="k-1")
    key = f"{handle.id}:charge_payment"
    wait_for(lambda: stack.requests_seen().get(key), 20, "the charge request to reach the service")

    stack.kill("agents", signal.SIGKILL)
    stack.agents("agents")
    view = handle.wait(40)

    assert view.process_state == "processed"
    charge = view.step("charge_payment")
    assert (charge.attempt, charge.failure_count) == (2, 1)
    assert len(charges_for(stack, handle)) == 1
    assert view.step("confirm_order").result == {"status": "paid"}
    shop.store.dispose()


def test_a_step_that_always_fails_ends_in_error_at_the_threshold_with_one_alert(stack, stack_env):
    shop = shop_app(stack_env, charge_timeout=1.0, max_failures=3)
    shop.migrate()
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "hang:30"}}, business_key="f-1")

    view = handle.wait(40)

    assert view.process_state == "error"
    charge = view.step("charge_payment")
    assert (charge.state, charge.failure_count, charge.attempt) == ("failed", 3, 3)
    assert view.run.failure_count == 3
    assert shop.store.count_events("alert", handle.id) == 1
    assert [(a["run_id"], a["step"]) for a in alerts_written(stack_env)] == [(handle.id, "charge_payment")]
    assert charges_for(stack, handle) == []
    shop.store.dispose()


def test_a_permanent_fault_puts_the_run_in_error_with_one_alert(stack, shop, stack_env):
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "permanent"}}, business_key="p-1")

    view = handle.wait(30)

    assert view.process_state == "error"
    assert "card declined" in view.run.error
    assert view.step("confirm_order").state == "not_started"
    wait_for(lambda: alerts_written(stack_env), 10, "the alert hook to run")
    assert len(alerts_written(stack_env)) == 1
    assert stack.requests_seen()[f"{handle.id}:charge_payment"] == 1


def test_a_late_reply_from_an_old_attempt_changes_nothing(stack, shop):
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "hang:30@1"}}, business_key="late-1")
    before = handle.wait(30)
    assert before.step("charge_payment").attempt == 2

    shop.celery.send_task("sas.scheduler.step_done", kwargs={
        "run_id": handle.id, "position": 0, "attempt": 1, "result": {"charge_id": "zombie"}},
        queue="sas.scheduler")
    wait_for(lambda: shop.store.count_events("stale_reply", handle.id), 20, "the late reply to be handled")

    after = handle.status()
    assert after.run == before.run
    assert after.steps == before.steps


def test_a_scheduler_killed_and_restarted_resumes_in_flight_runs(stack, shop):
    stack.up()
    handles = [shop.submit("order", {"amount": 1, "faults": {"charge": "latency:0.3"}}, business_key=f"s-{i}")
               for i in range(20)]
    wait_for(lambda: shop.store.count_runs_by_state().get("processed", 0) >= 3, 30, "some runs to finish")

    stack.kill("scheduler", signal.SIGKILL)
    stack.scheduler()

    views = [h.wait(60) for h in handles]
    assert [v.process_state for v in views] == ["processed"] * 20
    ledger = stack.ledger()
    assert len(ledger) == 20 and len({e["order_id"] for e in ledger}) == 20


def test_a_scheduler_that_dies_between_commit_and_publish_is_recovered(stack, shop):
    stack.payment_service()
    stack.scheduler(env={"SAS_FAULTS": "scheduler.after_commit=kill@once"})
    stack.agents()
    stack.beat()
    handle = shop.submit("order", {"amount": 3}, business_key="die-1")

    view = handle.wait(40)

    assert view.process_state == "processed"
    assert (view.step("charge_payment").attempt, view.step("charge_payment").failure_count) == (2, 1)
    assert len(charges_for(stack, handle)) == 1


def test_a_lost_submit_message_is_re_enqueued_by_the_supervisor(stack, shop):
    stack.up()
    faults.arm("submit.after_commit=raise", shop.settings.home)
    try:
        with pytest.raises(faults.FaultInjected):
            shop.submit("order", {"amount": 3}, business_key="lost-1")
    finally:
        faults.arm("")
    run = shop.store.find_run("order", "lost-1")
    assert run.process_state == "pending"

    view = shop.handle(run.id).wait(30)

    assert view.process_state == "processed"
    assert shop.store.count_events("requeue", run.id) >= 1


def test_a_zombie_agent_that_wakes_up_late_is_refused_by_the_remote_service(stack, stack_env, tmp_path):
    shop = shop_app(stack_env, charge_timeout=1.0)
    shop.migrate()
    stack.payment_service()
    stack.scheduler()
    stack.beat()
    # This agent passes its complete-by check, then stalls 4 s before calling the service. In the
    # threads pool no time limit interrupts it (prefork's soft limit would), so it wakes a zombie.
    stack.agents("zombie", concurrency=1, env={"SAS_FAULTS": "agent.before_call=sleep:4@once"}, pool="threads")
    handle = shop.submit("order", {"amount": 9}, business_key="z-1")
    marker = Path(stack_env["SAS_HOME"]) / "fault-agent.before_call"
    wait_for(marker.exists, 20, "the zombie to stall")

    stack.agents("healthy")
    view = handle.wait(30)
    key = f"{handle.id}:charge_payment"
    wait_for(lambda: stack.refused().get(key), 20, "the zombie's late request")

    assert view.process_state == "processed"
    assert view.step("charge_payment").attempt == 2
    [entry] = charges_for(stack, handle)
    assert entry["fencing_token"] == 2
    assert stack.refused()[key] == 1
    after = handle.status()
    assert after.steps == view.steps
    shop.store.dispose()
