"""Progress notifications to a submitter's reply_to queue, and wait() that sleeps until the
database says the run finished."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import event

from sas_app.interfaces.client import RECHECK
from sas_app.interfaces.notifications import Notifications
from tests.integration.conftest import shop_app

pytestmark = pytest.mark.integration

#: an order of one item: reserve_stock and fraud_check, charge_payment, the one shipment and the
#: step it is a branch of, confirm_order
HAPPY = ["received", "processing", *["step_completed"] * 6, "processed"]


def collect(shop, queue, until: str, timeout: float = 30, at_least: int = 0) -> list[dict]:
    """Notifications until ``until`` has arrived (and at least ``at_least`` of them)."""
    notes = []
    with Notifications(shop.celery, queue) as inbox:
        for note in inbox.iter(timeout=timeout):
            notes.append(note)
            if any(n["kind"] == until for n in notes) and len(notes) >= at_least:
                break
    return notes


@pytest.mark.both_brokers
def test_a_reply_to_consumer_receives_every_transition_in_order(stack, shop):
    stack.up()
    queue = f"replies-{uuid.uuid4().hex[:8]}"
    handle = shop.submit("order", {"amount": 5}, business_key="n-1", reply_to=queue)

    notes = collect(shop, queue, until="processed")

    assert [n["kind"] for n in notes] == HAPPY
    assert {(n["run_id"], n["business_key"]) for n in notes} == {(handle.id, "n-1")}
    completed = [n["step"] for n in notes if n["kind"] == "step_completed"]
    assert sorted(completed[:2]) == ["fraud_check", "reserve_stock"]  # side by side: either first
    assert completed[2:] == ["charge_payment", "schedule_shipping[0]", "schedule_shipping", "confirm_order"]
    # in id order along the run's path; the two side-by-side steps' completions are committed and
    # relayed by two processes at once, so either may come first (a loaded CI host swapped them)
    ids = [n["id"] for n in notes]
    assert len(set(ids)) == len(ids)
    assert ids[:2] + sorted(ids[2:4]) + ids[4:] == sorted(ids)


def test_compensation_is_reported_too(stack, shop):
    stack.up()
    queue = f"replies-{uuid.uuid4().hex[:8]}"
    shop.submit("order", {"amount": 5, "faults": {"charge": "permanent"}}, business_key="n-2", reply_to=queue)

    notes = collect(shop, queue, until="compensated")

    assert [n["kind"] for n in notes] == ["received", "processing", "step_completed", "step_completed",
                                          "compensating", "step_undone", "compensated"]


def test_a_scheduler_killed_between_commit_and_relay_neither_loses_nor_invents_a_notification(stack, stack_env):
    shop = shop_app(stack_env, step_timeout=2.0)
    shop.migrate()
    stack.services(wait=False)
    stack.scheduler(wait=False)
    stack.agents(env={"SAS_FAULTS": "scheduler.after_commit=kill@once"}, wait=False)
    stack.beat(wait=False)
    stack.wait_ready()
    queue = f"replies-{uuid.uuid4().hex[:8]}"
    handle = shop.submit("order", {"amount": 5}, business_key="n-3", reply_to=queue)

    # A step's completion was committed in an agent worker, which was killed before relaying its
    # notification; the Supervisor relays it (maybe after the run has finished): every
    # notification once, none invented.
    notes = collect(shop, queue, until="processed", timeout=40, at_least=len(HAPPY))

    assert (Path(stack_env["SAS_HOME"]) / "fault-scheduler.after_commit").exists(), "the kill happened"
    assert [n["kind"] for n in sorted(notes, key=lambda n: n["id"])] == HAPPY
    assert len({n["id"] for n in notes}) == len(notes)
    assert handle.wait(5).process_state == "processed"
    shop.store.dispose()


def test_wait_sleeps_until_the_database_says_the_run_finished(stack, shop):
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "latency:1"}}, business_key="n-4")
    statements = []
    event.listen(shop.store.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    started = time.monotonic()

    view = handle.wait(30)

    took = time.monotonic() - started
    assert view.process_state == "processed" and took >= 1.0  # the charge alone takes a second
    # the run is read when wait starts, again when PostgreSQL announces it finished, and at most
    # once a RECHECK (a second) in between, should a notice be lost; then the view (run, steps,
    # events). Polling, as on SQLite, would read it every half second at most.
    assert len(statements) <= 5 + int(took / RECHECK), (took, statements)
