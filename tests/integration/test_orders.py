"""The order example on the real stack: Redis, PostgreSQL, the payment and warehouse services,
Celery worker and beat processes. Each test states the fault, the action, and what the store and
the services' ledgers hold."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from sas_app import Submission
from tests.integration.conftest import shop_app, submit_unsent
from tests.support import wait_for
from workers.orders import orders

pytestmark = pytest.mark.integration


def applied(stack, service, handle, step, undo=False) -> list[dict]:
    """Entries of a service's ledger for one step of this run (or for its undo)."""
    key = f"{handle.id}:{step}" + (":undo" if undo else "")
    return [e for e in stack.ledger(service) if e["idempotency_key"] == key]


def alerts_written(stack_env) -> list[dict]:
    path = Path(stack_env["ALERT_FILE"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.both_brokers
@pytest.mark.pgbouncer_too
def test_happy_path_every_order_processed_and_each_effect_applied_once(stack, shop):
    stack.up()
    handles = [shop.submit("order", {"amount": 10 + i}, business_key=f"ord-{i}") for i in range(10)]

    views = [h.wait(30) for h in handles]

    assert [v.process_state for v in views] == ["processed"] * 10
    charges = [e for e in stack.ledger("payment") if e["action"] == "charge"]
    assert sorted(e["order_id"] for e in charges) == sorted(f"ord-{i}" for i in range(10))
    warehouse = [e["action"] for e in stack.ledger("warehouse")]
    assert (warehouse.count("reserve"), warehouse.count("ship"), len(warehouse)) == (10, 10, 20)
    with shop.store.engine.connect() as conn:
        statuses = conn.execute(select(orders.c.status, orders.c.charge_id)).all()
    assert {s for s, _ in statuses} == {"paid"} and all(c.startswith("cha_") for _, c in statuses)


@pytest.mark.parametrize("pooler", ["pgbouncer"], indirect=True)
def test_wait_returns_within_a_few_seconds_of_the_run_ending_even_behind_a_pooler(stack, shop):
    # behind PgBouncer in transaction mode the database's notice of the end never reaches the
    # waiting client: wait() reads the run again every second instead of sleeping to its timeout
    stack.up()
    shop.submit("order", {"amount": 1}, business_key="warm-up").wait(30)  # every worker has connected
    for i in range(3):
        handle = shop.submit("order", {"amount": 2}, business_key=f"w-{i}")
        started = time.monotonic()
        assert handle.wait(20).process_state == "processed"
        assert time.monotonic() - started < 10, "wait() returned once the run ended, not at its timeout"


def test_a_transient_fault_is_retried_inside_the_agent(stack, shop):
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "transient:2"}}, business_key="t-1")

    view = handle.wait(30)

    assert view.process_state == "processed"
    charge = view.step("charge_payment")
    assert (charge.attempt, charge.failure_count) == (1, 0)
    assert stack.requests_seen()[f"{handle.id}:charge_payment"] == 3
    assert len(applied(stack, "payment", handle, "charge_payment")) == 1


@pytest.mark.pgbouncer_too
def test_an_agent_that_hangs_past_complete_by_is_recovered_by_the_supervisor(stack, shop):
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "hang:30@1"}}, business_key="h-1")

    view = handle.wait(30)

    assert view.process_state == "processed"
    charge = view.step("charge_payment")
    assert (charge.attempt, charge.failure_count, view.run.failure_count) == (2, 1, 1)
    assert len(applied(stack, "payment", handle, "charge_payment")) == 1


@pytest.mark.both_brokers
@pytest.mark.pgbouncer_too
def test_an_agent_worker_killed_mid_step_is_recovered_and_charges_once(stack, stack_env, broker):
    # On RabbitMQ the charge's complete-by leaves room for a restarted worker to take the message back
    shop = shop_app(stack_env, charge_timeout=4.0 if broker == "redis" else 15.0)
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
    if broker == "redis":  # the message is Redis's again only after the visibility timeout: the Supervisor retries
        # the worker died whole, with no word of its attempt: retried with no failure counted
        assert (charge.attempt, charge.failure_count) == (2, 0)
        assert [e.detail["reason"] for e in view.events
                if e.position == charge.position and e.to_state == "pending"] == ["silent"]
    else:  # RabbitMQ gives a dead consumer's unacknowledged message back at once: attempt 1 again, same key
        assert (charge.attempt, charge.failure_count) == (1, 0) and stack.requests_seen()[key] == 2
    assert len(applied(stack, "payment", handle, "charge_payment")) == 1
    assert view.step("confirm_order").result == {"status": "paid"}
    shop.store.dispose()


def test_a_step_that_always_fails_stops_at_the_threshold_with_one_alert_and_is_undone(stack, stack_env):
    shop = shop_app(stack_env, charge_timeout=1.0, max_failures=3)
    shop.migrate()
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "hang:30"}}, business_key="f-1")

    view = handle.wait(40)

    charge = view.step("charge_payment")
    assert (charge.state, charge.failure_count, charge.attempt) == ("compensated", 3, 3)
    assert view.run.failure_count == 3
    assert view.process_state == "compensated"
    assert shop.store.count_events("alert", handle.id) == 1
    assert [(a["run_id"], a["step"]) for a in alerts_written(stack_env)] == [(handle.id, "charge_payment")]
    # no charge was ever applied, and the refund left a tombstone so a late one never will be
    assert applied(stack, "payment", handle, "charge_payment") == []
    [refund] = applied(stack, "payment", handle, "charge_payment", undo=True)
    assert refund["undoes"] is None
    [release] = applied(stack, "warehouse", handle, "reserve_stock", undo=True)
    assert release["undoes"] == f"{handle.id}:reserve_stock"
    shop.store.dispose()


def test_a_permanent_fault_after_two_steps_undoes_both_in_reverse_once(stack, shop, stack_env):
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"ship": "permanent"}}, business_key="p-1")

    view = handle.wait(30)

    assert view.process_state == "compensated"
    assert "refused" in view.run.error
    assert [s.name for s in view.steps if s.compensates is not None] == ["undo:charge_payment", "undo:reserve_stock"]
    refund, release = view.step("undo:charge_payment"), view.step("undo:reserve_stock")
    assert refund.completed_at < release.completed_at
    assert len(applied(stack, "payment", handle, "charge_payment")) == 1
    assert [e["undoes"] for e in applied(stack, "payment", handle, "charge_payment", undo=True)] == \
        [f"{handle.id}:charge_payment"]
    assert len(applied(stack, "warehouse", handle, "reserve_stock", undo=True)) == 1
    assert applied(stack, "warehouse", handle, "schedule_shipping:0", undo=True) == []  # it did nothing
    wait_for(lambda: alerts_written(stack_env), 10, "the alert hook to run")
    assert len(alerts_written(stack_env)) == 1


def test_an_undo_whose_agent_is_killed_is_recovered(stack, stack_env):
    # the undo of reserve_stock gets its 10 s: its second attempt, on an agent worker just
    # restarted, must not pass its complete-by on a busy machine (a third attempt)
    shop = shop_app(stack_env, charge_timeout=3.0, step_timeout=10.0)
    shop.migrate()
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "permanent", "release": "latency:2"}},
                         business_key="u-1")
    key = f"{handle.id}:reserve_stock:undo"
    wait_for(lambda: stack.requests_seen("warehouse").get(key), 20, "the release to reach the warehouse")

    stack.kill("agents", signal.SIGKILL)
    stack.agents("agents")
    view = handle.wait(40)

    assert view.process_state == "compensated"
    undo = view.step("undo:reserve_stock")
    assert (undo.attempt, undo.failure_count) == (2, 1)
    assert len(applied(stack, "warehouse", handle, "reserve_stock", undo=True)) == 1
    shop.store.dispose()


def test_an_undo_that_fails_for_good_leaves_the_run_in_error_and_resubmit_finishes_it(stack, shop, stack_env):
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "permanent", "release": "permanent@1"}},
                         business_key="e-1")
    view = handle.wait(30)
    assert view.process_state == "error"
    assert view.run.error.startswith("compensation failed")
    wait_for(lambda: len(alerts_written(stack_env)) == 2, 10, "both alerts")

    shop.resubmit(handle.id, by="ops", reason="warehouse fixed")
    view = handle.wait(30)

    assert view.process_state == "compensated"
    assert view.step("undo:reserve_stock").attempt == 2
    assert len(applied(stack, "warehouse", handle, "reserve_stock", undo=True)) == 1


def test_cancel_mid_run_compensates_and_no_charge_survives(stack, shop):
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "latency:1.5"}}, business_key="c-1")
    wait_for(lambda: stack.requests_seen().get(f"{handle.id}:charge_payment"), 20, "the charge to be in flight")

    assert shop.cancel(handle.id, by="ops", reason="customer called") == "compensating"
    view = handle.wait(30)

    assert view.process_state == "cancelled"
    assert view.step("confirm_order").state == "not_started"
    charges = applied(stack, "payment", handle, "charge_payment")
    refunds = applied(stack, "payment", handle, "charge_payment", undo=True)
    assert len(refunds) == 1
    assert all(c["undone_by"] == refunds[0]["idempotency_key"] for c in charges)
    assert len(applied(stack, "warehouse", handle, "reserve_stock", undo=True)) == 1


def test_a_late_reply_from_an_old_attempt_changes_nothing(stack, shop):
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "hang:30@1"}}, business_key="late-1")
    before = handle.wait(30)
    assert before.step("charge_payment").attempt == 2

    shop.celery.send_task("sas.scheduler.step_done", kwargs={
        "run_id": handle.id, "position": 1, "attempt": 1, "result": {"effect_id": "zombie"}},
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
    charges = [e for e in stack.ledger("payment") if e["action"] == "charge"]
    assert len(charges) == 20 and len({e["order_id"] for e in charges}) == 20


def test_a_scheduler_that_dies_between_commit_and_publish_is_recovered(stack, shop):
    # The Scheduler's reply handler runs in the agent workers: the first one to complete a step
    # commits "reserve_stock completed, charge_payment running" and dies before publishing.
    stack.services(wait=False)
    stack.scheduler(wait=False)
    stack.agents(env={"SAS_FAULTS": "scheduler.after_commit=kill@once"}, wait=False)
    stack.beat(wait=False)
    stack.wait_ready()
    handle = shop.submit("order", {"amount": 3}, business_key="die-1")

    view = handle.wait(40)

    assert view.process_state == "processed"
    assert view.step("reserve_stock").attempt == 1
    charge = view.step("charge_payment")
    # its message was never sent, and no agent said it took it: retried with no failure counted
    assert (charge.attempt, charge.failure_count) == (2, 0)
    assert len(applied(stack, "warehouse", handle, "reserve_stock")) == 1
    assert len(applied(stack, "payment", handle, "charge_payment")) == 1


@pytest.mark.both_brokers
def test_a_lost_submit_message_is_re_enqueued_by_the_supervisor(stack, stack_env):
    """Without a Scheduler in the submitting process (SAS_INLINE_REPLIES off) a run waits pending for
    the Scheduler's message; were it lost, the Supervisor sends it again after SAS_PICKUP_TIMEOUT."""
    shop = shop_app({**stack_env, "SAS_INLINE_REPLIES": "false"})
    shop.migrate()
    stack.up()
    run = submit_unsent(shop, "lost-1")
    assert run.process_state == "pending"

    view = shop.handle(run.id).wait(30)

    assert view.process_state == "processed"
    assert shop.store.count_events("requeue", run.id) >= 1
    shop.store.dispose()


@pytest.mark.both_brokers
def test_a_submit_whose_first_step_was_never_dispatched_is_recovered_by_the_supervisor(stack, stack_env):
    """By default the submitting process starts its run in the transaction that writes it; a crash
    before the first step's message is sent leaves that step running with nobody on it, and the
    Supervisor retries it at its complete-by. (Steps of 4 s: on a busy CI machine the example's
    services once took 2 s to answer the retry, and it expired too.)"""
    shop = shop_app(stack_env, step_timeout=4.0)
    shop.migrate()
    stack.up()
    run = submit_unsent(shop, "lost-2")
    first = shop.store.get_steps(run.id)[0]
    assert (run.process_state, first.state, first.attempt) == ("processing", "running", 1)

    view = shop.handle(run.id).wait(30)

    assert view.process_state == "processed"
    assert view.step("reserve_stock").attempt == 2  # the attempt never sent, then the Supervisor's
    assert len(applied(stack, "warehouse", view, "reserve_stock")) == 1
    shop.store.dispose()


def test_a_batch_submitted_at_once_is_processed_once_each(stack, shop):
    stack.up()
    items = [Submission("order", {"amount": i + 1}, f"batch-{i}") for i in range(30)]
    outcomes = shop.submit_many([*items, Submission("order", {"amount": -1}, "batch-bad"), items[0]])

    assert [o.ok for o in outcomes] == [True] * 30 + [False, True]
    assert outcomes[-1].handle.id == outcomes[0].handle.id and not outcomes[-1].handle.created
    views = [o.handle.wait(60) for o in outcomes[:30]]
    assert {v.process_state for v in views} == {"processed"}
    assert all(len(applied(stack, "payment", v, "charge_payment")) == 1 for v in views)
    assert shop.store.find_run("order", "batch-bad") is None


def test_a_zombie_agent_that_wakes_up_late_is_refused_by_the_remote_service(stack, stack_env):
    shop = shop_app(stack_env, charge_timeout=4.0)
    shop.migrate()
    stack.services(wait=False)
    stack.scheduler(wait=False)
    stack.beat(wait=False)
    stack.worker("others", "sas.agent.fraud,sas.agent.warehouse,sas.agent.orders", wait=False)
    stack.wait_ready()
    # This payment agent passes its complete-by check, then stalls 10 s before calling the service.
    # In the threads pool no time limit interrupts it (prefork's soft limit would): a zombie. The
    # healthy worker started once it stalls has until the retry's own complete-by (about 8 s) to be
    # consuming: a worker took 7 s to start on a loaded 2-core machine.
    stack.worker("zombie", "sas.agent.payment", 1, env={"SAS_FAULTS": "agent.before_call.charge_payment=sleep:10@once"},
                 pool="threads")
    handle = shop.submit("order", {"amount": 9}, business_key="z-1")
    marker = Path(stack_env["SAS_HOME"]) / "fault-agent.before_call.charge_payment"
    wait_for(marker.exists, 20, "the zombie to stall")

    stack.worker("healthy", "sas.agent.payment")
    view = handle.wait(30)
    key = f"{handle.id}:charge_payment"
    wait_for(lambda: stack.refused().get(key), 20, "the zombie's late request")

    assert view.process_state == "processed"
    attempt = view.step("charge_payment").attempt  # 2; 3 when a loaded machine made the second late too
    [entry] = applied(stack, "payment", handle, "charge_payment")
    assert attempt >= 2 and entry["fencing_token"] == attempt
    assert 1 <= stack.refused()[key] <= attempt - 1  # the zombie's, and any other superseded attempt's
    assert handle.status().steps == view.steps
    shop.store.dispose()
