"""The broker as a trust boundary (SAS_BROKER_TRUST): with ``signed``, the Scheduler takes
``sas.submit`` and ``sas.signal`` only with a valid HMAC of a key it knows; with ``closed``, not at
all. A refusal is logged and in the audit trail, and nothing else is written."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import re
import time

import pytest

from sas_app import Producer
from sas_app.messaging.routing import SCHEDULER_QUEUE, SIGNAL, SUBMIT
from sas_app.messaging.signing import Gate, sign

KEY = "billing:" + "s" * 40
OLD_KEY = "old:" + "o" * 40


@pytest.fixture
def settings(settings, request):
    trust = getattr(request, "param", "signed")
    return dataclasses.replace(settings, broker_trust=trust, broker_keys=f"{KEY},{OLD_KEY}")


def refusals(sas):
    return [(r.actor, r.via, r.action, r.outcome, r.refusal) for r in reversed(sas.store.audit_rows())]


def send(sas, task, kwargs):
    sas.celery.send_task(task, queue=SCHEDULER_QUEUE, kwargs=kwargs)


def test_a_signed_submission_and_signal_are_taken_and_unsigned_ones_refused(sas, pump):
    producer = Producer(sas.settings.broker_url, signing_key=KEY)
    producer.submit("claim", {"n": 1}, business_key="signed-1")
    pump.run()
    run = sas.store.find_run("claim", "signed-1")
    assert run is not None and run.process_state == "processing"

    send(sas, SUBMIT, {"workflow": "claim", "payload": {}, "business_key": "unsigned"})
    send(sas, SIGNAL, {"event": "approval", "payload": {"approved": True}, "run_id": run.id})
    pump.run()
    assert sas.store.find_run("claim", "unsigned") is None
    assert sas.store.signals_of(run.id) == [], "the unsigned approval wrote nothing"
    assert refusals(sas) == [("unsigned", "broker", "submit", "refused", "the message is not signed"),
                             ("unsigned", "broker", "signal", "refused", "the message is not signed")]

    producer.signal("approval", {"approved": True}, run_id=run.id, by="billing-service")
    producer.close()
    pump.run()
    assert sas.store.get_run(run.id).process_state == "processed"
    [signal] = sas.store.signals_of(run.id)
    assert signal.sent_by == "billing-service"


def test_a_tampered_an_unknown_key_and_an_old_signature_are_refused_naming_why(sas, pump):
    kwargs = {"workflow": "three", "payload": {"amount": 5}, "business_key": "t-1"}
    signed = {**kwargs, "sas_signature": sign(SUBMIT, kwargs, *KEY.split(":"), time.time())}
    send(sas, SUBMIT, {**signed, "payload": {"amount": 5000}})  # changed on the way
    forged = {**kwargs, "sas_signature": sign(SUBMIT, kwargs, "billing", "x" * 40, time.time())}
    send(sas, SUBMIT, forged)
    send(sas, SUBMIT, {**kwargs, "sas_signature": sign(SUBMIT, kwargs, "mallory", "m" * 40, time.time())})
    send(sas, SUBMIT, {**kwargs, "sas_signature": sign(SUBMIT, kwargs, *KEY.split(":"), time.time() - 86401)})
    pump.run()
    assert sas.store.list_runs() == []
    reasons = [r[4] for r in refusals(sas)]
    assert reasons[0] == reasons[1] == ("the signature does not match the message under key 'billing': it was "
                                        "changed, or signed with another secret")
    assert reasons[2] == "no key 'mallory' here (SAS_BROKER_KEYS)"
    # signed 86,401 s ago, and read a moment later (a second more on a busy machine)
    age = re.match(r"the signature is (\d+) s old, over the 86400 s allowed", reasons[3])
    assert age is not None and 86401 <= int(age.group(1)) <= 86461 and "a replay" in reasons[3]

    send(sas, SUBMIT, signed)
    send(sas, SUBMIT, signed)  # replayed within the window: the business key makes it one run
    send(sas, SUBMIT, {**kwargs, "sas_signature": sign(SUBMIT, kwargs, *OLD_KEY.split(":"), time.time())})
    pump.run()
    [run] = sas.store.list_runs()
    assert (run.business_key, run.process_state, run.payload) == ("t-1", "processed", {"amount": 5})


def test_a_plain_celery_producer_signs_with_hmac_and_json_alone(sas, pump):
    """What the docs show a producer without sas_app doing."""
    key_id, secret = KEY.split(":", 1)
    kwargs = {"workflow": "three", "payload": {"amount": 12.5, "note": "café"}, "business_key": "plain-1"}
    ts = time.time()
    body = json.dumps({"task": "sas.submit", "kwargs": kwargs, "ts": ts}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()
    mac = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    send(sas, "sas.submit", {**kwargs, "sas_signature": {"key": key_id, "ts": ts, "mac": mac}})
    pump.run()
    run = sas.store.find_run("three", "plain-1")
    assert run is not None and run.process_state == "processed"


@pytest.mark.parametrize("settings", ["closed"], indirect=True)
def test_a_closed_broker_takes_no_submission_even_signed(sas, pump):
    producer = Producer(sas.settings.broker_url, signing_key=KEY)
    producer.submit("three", {}, business_key="closed-1")
    producer.close()
    pump.run()
    assert sas.store.list_runs() == []
    assert [r[4] for r in refusals(sas)] == ["this deployment takes no sas.submit from the broker "
                                             "(SAS_BROKER_TRUST=closed)"]
    assert sas.submit("three", {}, business_key="closed-2").id, "the Python client is not the broker's door"


@pytest.mark.parametrize("settings", ["open"], indirect=True)
def test_an_open_broker_takes_unsigned_work_but_refuses_a_bad_signature(sas, pump):
    send(sas, SUBMIT, {"workflow": "three", "payload": {}, "business_key": "open-1"})
    kwargs = {"workflow": "three", "payload": {}, "business_key": "open-2"}
    send(sas, SUBMIT, {**kwargs, "sas_signature": {"key": "billing", "ts": time.time(), "mac": "00"}})
    pump.run()
    assert [r.business_key for r in sas.store.list_runs()] == ["open-1"]


def test_a_retried_message_is_signed_again_so_a_long_outage_does_not_age_it_out():
    clock = [1000.0]
    gate = Gate("signed", KEY, 300, clock=lambda: clock[0])
    kwargs = {"workflow": "three", "payload": {}, "business_key": "k"}
    sent = {**kwargs, "sas_signature": sign(SUBMIT, kwargs, *KEY.split(":"), 1000.0)}
    verified = gate.admit(SUBMIT, sent)
    assert verified == "billing"
    clock[0] += 3600  # the store was down for an hour; the worker retried all along
    with pytest.raises(ValueError, match="3600 s old"):
        gate.admit(SUBMIT, sent)
    assert gate.admit(SUBMIT, gate.resigned(SUBMIT, sent, verified)) == "billing"


@pytest.mark.parametrize(("signature", "why"), [
    ({"key": "billing", "ts": 0, "mac": "é"}, "its mac 64 hexadecimal digits"),
    ({"key": "billing", "ts": float("nan"), "mac": "0" * 64}, "a finite number"),
    ({"key": "billing", "ts": 1e308 * 10, "mac": "0" * 64}, "a finite number"),
    ({"key": "billing", "ts": 1.0, "mac": "0" * 64, "extra": 1}, "must be {key, ts, mac}"),
    ("billing", "must be {key, ts, mac}"),
])
def test_a_forged_signature_is_refused_and_never_signed_again_by_the_worker(signature, why):
    """A mac a comparison cannot take, a time that never ages: refused as a bad signature, so the
    task never reaches its retry, whose message the worker would sign with a real key."""
    gate = Gate("signed", KEY, 300)
    sent = {"workflow": "three", "payload": {}, "business_key": "forged", "sas_signature": signature}
    with pytest.raises(ValueError, match=why):
        gate.admit(SUBMIT, sent)
    assert gate.resigned(SUBMIT, sent, None) == sent, "what was not verified goes as it came"


def test_a_message_that_json_reads_back_otherwise_is_signed_as_it_will_be_read():
    gate = Gate("signed", KEY, 300)
    sent = {"workflow": "three", "payload": {10: "a", 9: "b"}, "business_key": "k"}
    signature = sign(SUBMIT, sent, *KEY.split(":"), time.time())
    delivered = json.loads(json.dumps({**sent, "sas_signature": signature}))
    assert gate.admit(SUBMIT, delivered) == "billing"
    with pytest.raises(ValueError, match="keyword arguments only"):
        gate.admit(SUBMIT, delivered, args=["three"])


def test_an_authentic_submission_held_too_long_is_answered_on_reply_to(sas, pump):
    from sas_app.interfaces.notifications import Notifications

    kwargs = {"workflow": "three", "payload": {}, "business_key": "late", "reply_to": "late-replies"}
    send(sas, SUBMIT, {**kwargs, "sas_signature": sign(SUBMIT, kwargs, *KEY.split(":"), time.time() - 90000)})
    forged = {**kwargs, "reply_to": "someone-elses", "business_key": "forged"}
    send(sas, SUBMIT, {**forged, "sas_signature": {"key": "billing", "ts": time.time(), "mac": "0" * 64}})
    pump.run()
    with Notifications(sas.celery, "late-replies") as inbox:
        answer = inbox.get(timeout=2)
    assert answer is not None and answer["kind"] == "refused" and "90000 s old" in answer["reason"]
    with Notifications(sas.celery, "someone-elses") as inbox:
        assert inbox.get(timeout=0.5) is None, "an unverified sender is answered nothing"
    assert [(r.actor, r.origin) for r in reversed(sas.store.audit_rows())] == [
        ("unverified", "the broker, claiming key billing")] * 2


@pytest.mark.parametrize(("trust", "keys", "message"), [
    ("signed", "", "SAS_BROKER_TRUST=signed needs SAS_BROKER_KEYS"),
    ("trusting", "", "SAS_BROKER_TRUST must be open, signed or closed"),
    ("signed", "k:short", "the secret of key 'k' is shorter than 32 characters"),
    ("signed", "bad id:" + "s" * 40, "each id 1-40 letters"),
])
def test_a_deployment_with_a_bad_trust_setting_is_refused_at_start(tmp_path, trust, keys, message):
    from sas_app import SasApp, Settings

    with pytest.raises(ValueError, match=message):
        SasApp(Settings(home=tmp_path, broker_trust=trust, broker_keys=keys))
