"""Submitting with only the broker (the Celery task ``sas.submit``, and :class:`sas_app.Producer`),
and a store whose schema is missing: created on first use for the embedded default, one clear
error naming ``sas migrate`` on any other."""

from __future__ import annotations

import pytest

from sas_app import Producer, SasApp, SchemaNotReady, Settings, Step, Workflow
from sas_app.interfaces.notifications import Notifications
from sas_app.messaging.routing import SCHEDULER_QUEUE, SUBMIT


def test_a_submission_sent_as_a_message_makes_one_run_however_often_it_arrives(sas, pump):
    for _ in range(2):  # a producer retrying, or the broker redelivering
        sas.celery.send_task(SUBMIT, queue=SCHEDULER_QUEUE, kwargs={
            "workflow": "three", "payload": {"n": 1}, "business_key": "by-message"})
    pump.run()
    [run] = sas.store.list_runs(workflow="three")
    assert (run.business_key, run.process_state) == ("by-message", "processed")


def test_the_producer_needs_only_the_broker(sas, pump):
    producer = Producer(sas.settings.broker_url)  # no database, no workflow code
    producer.submit("three", {"n": 2}, business_key="from-producer", priority=7)
    producer.close()
    pump.run()
    run = sas.store.find_run("three", "from-producer")
    assert run is not None and (run.process_state, run.priority) == ("processed", 7)


@pytest.mark.parametrize("kwargs, reason", [
    ({"workflow": "nope", "payload": {}}, "unknown workflow 'nope'"),
    ({"workflow": "three", "payload": ["not", "an", "object"]}, "payload must be a JSON object"),
    ({"workflow": "three", "payload": {}, "priority": 11}, "priority must be an integer from 0"),
])
def test_a_refused_submission_is_answered_on_reply_to_and_writes_nothing(sas, pump, kwargs, reason):
    sas.celery.send_task(SUBMIT, queue=SCHEDULER_QUEUE,
                         kwargs={**kwargs, "business_key": "bad-1", "reply_to": "my-replies"})
    pump.run()
    assert sas.store.list_runs() == []
    with Notifications(sas.celery, "my-replies") as inbox:
        answer = inbox.get(timeout=2)
    assert answer is not None and (answer["kind"], answer["business_key"]) == ("refused", "bad-1")
    assert reason in answer["reason"]


def test_the_same_key_with_another_payload_is_refused_by_message_too(sas, pump):
    sas.submit("three", {"n": 1}, business_key="k-1")
    sas.celery.send_task(SUBMIT, queue=SCHEDULER_QUEUE, kwargs={
        "workflow": "three", "payload": {"n": 2}, "business_key": "k-1", "reply_to": "my-replies"})
    pump.run()
    with Notifications(sas.celery, "my-replies") as inbox:
        kinds = [n["kind"] for n in inbox.iter(timeout=1)]
    assert "refused" in kinds and len(sas.store.list_runs()) == 1


def test_the_embedded_default_creates_its_schema_on_first_use(tmp_path):
    home = tmp_path / "fresh"
    settings = Settings.from_env({"SAS_HOME": str(home)}, broker_url="memory://localhost/", inline_replies=False)
    assert settings.embedded_store
    app = SasApp(settings)  # no migrate
    app.agent("svc").action(lambda call: {"ok": True}, name="work")
    app.register(Workflow("one", [Step("a", "svc.work")]))
    handle = app.submit("one", {}, business_key="first-use")
    assert app.get_run(handle.id).process_state == "pending"
    app.store.dispose()


def test_a_server_store_without_its_schema_is_one_clear_error_from_submit(tmp_path):
    app = SasApp(Settings(database_url=f"sqlite:///{tmp_path / 'elsewhere.db'}", broker_url="memory://localhost/",
                          home=tmp_path / "home", inline_replies=False))
    app.agent("svc").action(lambda call: {"ok": True}, name="work")
    app.register(Workflow("one", [Step("a", "svc.work")]))
    with pytest.raises(SchemaNotReady, match="the state store has no schema yet: run `sas migrate`"):
        app.submit("one", {}, business_key="k")
    app.store.dispose()
