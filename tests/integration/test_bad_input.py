"""Hostile or broken messages on the pattern's queues: refused with a logged reason, no state
changes, and the worker goes on serving good messages."""

from __future__ import annotations

import uuid

import pytest
from kombu import Exchange, Queue

from tests.integration.conftest import shop_app, submit_unsent
from tests.support import wait_for

pytestmark = pytest.mark.integration


def pending_run(shop, key: str):
    """A run whose submit message never went out: it stays pending (the pick-up timeout is long,
    and ``shop`` has SAS_INLINE_REPLIES off: it does not start its runs itself)."""
    return submit_unsent(shop, key, amount=2)


def test_a_pickled_message_is_refused_and_never_run(stack, stack_env):
    stack.env["SAS_PICKUP_TIMEOUT"] = "120"
    shop = shop_app({**stack_env, "SAS_PICKUP_TIMEOUT": "120", "SAS_INLINE_REPLIES": "false"})
    shop.migrate()
    stack.up()
    run = pending_run(shop, "pickled")

    shop.celery.send_task("sas.scheduler.advance", args=[run.id], queue="sas.scheduler", serializer="pickle")
    refused = "Refusing to deserialize untrusted content of type pickle"
    wait_for(lambda: refused in stack.log("scheduler"), 20, "the worker to refuse the pickle")

    assert shop.store.get_run(run.id).process_state == "pending"
    assert shop.submit("order", {"amount": 3}, business_key="after-pickle").wait(30).process_state == "processed"
    shop.store.dispose()


def publish_raw(shop, queue: str, task: str, body: bytes, content_type: str) -> str:
    """A message as a foreign producer might put it on our queue: Celery's headers, any body."""
    task_id = uuid.uuid4().hex
    with shop.celery.connection_for_write() as conn:
        conn.Producer().publish(body, exchange=queue, routing_key=queue, content_type=content_type,
                                content_encoding="utf-8", headers={"task": task, "id": task_id, "lang": "py"},
                                declare=[Queue(queue, Exchange(queue), routing_key=queue)])
    return task_id


def test_bodies_that_are_not_json_are_refused_unrun_on_every_queue(stack, stack_env):
    shop = shop_app({**stack_env, "SAS_PICKUP_TIMEOUT": "120", "SAS_INLINE_REPLIES": "false"})
    shop.migrate()
    stack.env["SAS_PICKUP_TIMEOUT"] = "120"
    stack.up()
    run = pending_run(shop, "not-json")
    step = shop.store.get_steps(run.id)[0]
    good_step = {"run_id": run.id, "business_key": "not-json", "workflow": "order", "step": step.name,
                 "position": 0, "attempt": 1, "idempotency_key": step.idempotency_key, "payload": run.payload,
                 "results": {}, "budget": 5.0}

    shop.celery.send_task("sas.agent.warehouse.reserve", kwargs=good_step, queue="sas.agent.warehouse",
                          serializer="pickle")
    publish_raw(shop, "sas.scheduler", "sas.scheduler.advance", b'[["' + run.id.encode() + b'"', "application/json")
    publish_raw(shop, "sas.agent.warehouse", "sas.agent.warehouse.reserve", b"{not json", "application/json")
    publish_raw(shop, "sas.scheduler", "sas.scheduler.advance", b"- " + run.id.encode(), "application/x-yaml")

    logs = lambda: stack.log("scheduler") + stack.log("agents")  # noqa: E731
    wait_for(lambda: logs().count("Refusing to deserialize untrusted content of type pickle") >= 1
             and logs().count("Refusing to deserialize untrusted content of type yaml") >= 1
             and logs().count("Can't decode message body") >= 2, 20, "every bad body to be refused")

    assert shop.store.get_run(run.id).process_state == "pending"
    assert shop.store.get_steps(run.id)[0].attempt == 0
    assert stack.requests_seen("warehouse") == {}  # no agent called its service
    assert shop.submit("order", {"amount": 3}, business_key="after-bad-bodies").wait(30).process_state == "processed"
    shop.store.dispose()


def test_messages_with_missing_or_wrong_arguments_change_nothing(stack, shop):
    stack.up()
    done = shop.submit("order", {"amount": 4}, business_key="intact").wait(30)
    before = done.steps

    bad = [
        shop.celery.send_task("sas.scheduler.step_done", kwargs={"run_id": done.id}, queue="sas.scheduler"),
        shop.celery.send_task("sas.scheduler.step_done", args=["no-such-run", 0, 1], queue="sas.scheduler"),
        shop.celery.send_task("sas.scheduler.step_done", kwargs={"run_id": done.id, "position": 99, "attempt": 1},
                              queue="sas.scheduler"),
        shop.celery.send_task("sas.agent.payment.charge", kwargs={"bogus": True}, queue="sas.agent.payment"),
    ]
    wrong_types = [
        shop.celery.send_task("sas.scheduler.step_done", args=[done.id, "abc", {"x": 1}], queue="sas.scheduler"),
        shop.celery.send_task("sas.scheduler.step_failed", args=[["a list"], 1, 1], queue="sas.scheduler"),
        shop.celery.send_task("sas.scheduler.advance", args=[{"run": done.id}], queue="sas.scheduler"),
    ]
    logs = lambda: stack.log("scheduler") + stack.log("agents")  # noqa: E731
    wait_for(lambda: all(b.id in logs() for b in bad[:3]), 20, "the Scheduler to handle the bad messages")
    wait_for(lambda: "rejected a malformed message" in stack.log("agents"), 20,
             "the agent to reject its bad message")
    wait_for(lambda: stack.log("scheduler").count("rejected a malformed message") == len(wrong_types),
             20, "the Scheduler to reject the wrongly typed messages")

    assert shop.handle(done.id).status().steps == before
    assert shop.submit("order", {"amount": 5}, business_key="still-alive").wait(30).process_state == "processed"
