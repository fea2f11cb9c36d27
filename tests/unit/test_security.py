"""Secure defaults a user gets without asking: JSON only on every queue, and every value that
reaches the state store travels as a bound parameter, never as SQL text."""

from __future__ import annotations

import logging
import socket

import pytest
from sqlalchemy import event, inspect

from sas_app.engine.alerts import WebhookSender
from sas_app.settings import mask_secrets
from tests.support import wait_for

MARK = "Zq9-hostile"
KEY = MARK + "'); DROP TABLE runs; --\"%_\\"


@pytest.mark.both_stores
def test_every_value_reaches_the_store_as_a_bound_parameter(sas, pump):
    statements: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        statements.append((statement, parameters))

    event.listen(sas.store.engine, "before_cursor_execute", record)
    try:
        # a whole life: submit, steps, a permanent failure, compensation, operators, a stale reply
        failed = sas.submit("saga", {"note": MARK + "'\";", "script": {"second": ["permanent"]}}, business_key=KEY)
        other = sas.submit("saga", {"note": MARK}, business_key=KEY + "-2")
        sas.pause(other.id, by=MARK + "' OR '1'='1", reason=MARK + "; DELETE FROM steps")
        pump.run()
        sas.resume(other.id, by=MARK, reason=MARK)
        pump.run()
        sas.scheduler.step_done(failed.id, 0, 1, {"late": MARK + "')"})
        assert sas.store.find_run("saga", KEY).id == failed.id
    finally:
        event.remove(sas.store.engine, "before_cursor_execute", record)

    assert statements
    assert not [s for s, _ in statements if MARK in s], "a value was written into SQL text"
    assert sum(MARK in repr(p) for _, p in statements) >= 5  # they travelled, as parameters
    assert (failed.status().process_state, other.status().process_state) == ("compensated", "processed")
    assert {"runs", "steps", "events"} <= set(inspect(sas.store.engine).get_table_names())


def test_every_queue_accepts_json_only(sas):
    conf = sas.celery.conf
    assert conf.accept_content == ["json"]
    assert (conf.task_serializer, conf.result_serializer, conf.event_serializer) == ("json", "json", "json")


def test_a_failing_alert_webhook_is_logged_without_its_credentials_or_token(caplog):
    # A chat webhook keeps its secret in the path; some URLs carry a password too.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    url = f"http://ops:pw-{MARK}@127.0.0.1:{closed}/services/T0/B1/tok-{MARK}?key=k-{MARK}"
    sender = WebhookSender(url, timeout=0.5, tries=1)

    with caplog.at_level(logging.ERROR, logger="sas_app.engine.alerts"):
        sender.send({"run_id": "r-1"})
        wait_for(lambda: "alert webhook" in caplog.text, 10, "the webhook's failure to be logged")

    assert f"http://127.0.0.1:{closed}/" in caplog.text and "failed 1 times for run r-1" in caplog.text
    assert MARK not in caplog.text


def test_messages_from_errors_are_masked_with_the_settings_passwords():
    env = {"SAS_DATABASE_URL": f"postgresql+psycopg2://sas:db-{MARK}@db/sas",
           "SAS_BROKER_URL": f"redis://:mq-{MARK}@mq:6379/0",
           "SAS_ALERT_WEBHOOK": f"https://hooks.example/services/tok-{MARK}"}
    text = f"could not reach db-{MARK} via redis://:mq-{MARK}@mq:6379/0 nor https://hooks.example/services/tok-{MARK}"
    assert MARK not in mask_secrets(text, env)
