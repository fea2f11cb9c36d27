"""Alerts reach every sink once: the events table, the hook, a webhook; a dead webhook does not
slow the Supervisor; a step whose agent queue is too deep is flagged at risk before it expires."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select

from harness.proxy import Proxy
from sas_app import SasApp, Settings, Step, Workflow
from sas_app.store.service_tables import looks
from sas_app.store.tables import alerts
from tests.integration.conftest import shop_app
from tests.support import FakeClock, Pump, look, pass_time, wait_for
from tests.testapp import install_test_workflows

pytestmark = pytest.mark.integration


@pytest.fixture
def webhook():
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/alerts", received
    server.shutdown()
    server.server_close()


@pytest.fixture
def dead_webhook():
    """Accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(50)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/alerts"
    sock.close()


def test_the_webhook_sink_receives_an_alert_once(stack, shop, webhook):
    url, received = webhook
    stack.env["SAS_ALERT_WEBHOOK"] = url
    stack.up()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "permanent"}}, business_key="w-1")
    handle.wait(30)

    wait_for(lambda: received, 20, "the webhook to be called")
    assert [(a["run_id"], a["kind"], a["step"]) for a in received] == [(handle.id, "failed", "charge_payment")]
    assert shop.store.count_events("alert", handle.id) == 1


def test_a_dead_webhook_does_not_delay_the_supervisor(stack, stack_env, dead_webhook):
    shop = shop_app(stack_env, charge_timeout=1.0)
    shop.migrate()
    stack.env["SAS_ALERT_WEBHOOK"] = dead_webhook
    stack.up()
    # Alerts whose webhook hangs 2 s per try, retried...
    for i in range(3):
        shop.submit("order", {"amount": 5, "faults": {"charge": "permanent"}}, business_key=f"d-{i}").wait(30)
    # ...while a step that needs the Supervisor is recovered on time.
    started = time.monotonic()
    handle = shop.submit("order", {"amount": 5, "faults": {"charge": "hang:30@1"}}, business_key="d-hang")
    view = handle.wait(30)

    assert view.process_state == "processed"
    assert view.step("charge_payment").failure_count == 1
    # complete-by 1 s + sweep every 0.5 s + back-off 0.2 s + the other steps: well under 5 s
    assert time.monotonic() - started < 5
    shop.store.dispose()


def test_a_step_whose_agent_queue_is_too_deep_is_flagged_at_risk_once(stack, stack_env):
    shop = shop_app(stack_env, step_timeout=4.0)
    shop.migrate()
    stack.services(wait=False)
    stack.scheduler(wait=False)
    stack.beat(wait=False)
    stack.wait_ready()
    handles = [shop.submit("order", {"amount": 5}, business_key=f"r-{i}") for i in range(3)]

    # each order's reservation and fraud check wait side by side, on two agents' queues
    wait_for(lambda: len(at_risk_alerts(shop)) == 6, 10, "an at-risk alert for each waiting step")
    for _ in range(3):  # more looks see the same steps at risk: nothing new is raised
        assert look(shop) == []
    assert len(at_risk_alerts(shop)) == 6
    stack.agents()
    assert [h.wait(30).process_state for h in handles] == ["processed"] * 3
    for h in handles:
        events = [e for e in shop.store.get_events(h.id) if e.kind == "alert"]
        assert {e.detail["kind"] for e in events} == {"at_risk"}
        assert sorted(e.detail["step"] for e in events) == ["fraud_check", "reserve_stock"]
    shop.store.dispose()


@pytest.fixture
def silent(redis_url, tmp_path, request):
    """An app on Redis (through a proxy a test may cut) and a SQLite store on a test clock, with
    three runs whose steps (20 s each) wait for svc, whose workers are away; the Supervisor has
    looked once: it has seen the queue since."""
    redis_port, db = redis_url.rsplit(":", 1)[1].split("/")
    proxy = Proxy(int(redis_port))
    clock = FakeClock()
    sas = SasApp(Settings(database_url=f"sqlite:///{tmp_path / 'state.db'}", home=tmp_path / "home",
                          broker_url=f"redis://127.0.0.1:{proxy.port}/{db}", task_events=False,
                          inline_replies=False, at_risk_interval=0.1), clock=clock)
    sas.test_clock = clock
    install_test_workflows(sas)
    sas.register(Workflow("call", [Step("call", "svc.work", timeout=20, max_failures=3)]))
    sas.migrate()
    runs = [sas.submit("call", {}, business_key=f"silent-{i}").id for i in range(3)]
    Pump(sas).run(["sas.scheduler"])
    assert look(sas) == []  # seen from here
    left = getattr(request, "param", 3.9)  # by default the last fifth of the steps' budget
    pass_time(sas, sas.store.get_steps(runs[0])[0].complete_by - left, "the steps' time left")
    yield sas, proxy, runs
    proxy.close()
    sas.store.dispose()


def test_a_silent_queue_is_not_called_stuck_by_a_supervisor_that_could_not_read_the_broker_lately(silent):
    """The broker down for everyone: the queue's workers completed nothing, and reconnect as the
    Supervisor does. Told not draining the moment it could read the broker again, a soak's steps at
    the head of their queue were taken in time. Once it has seen the queue still silent a while, it is."""
    sas, proxy, runs = silent
    proxy.cut(60)
    assert look(sas) == []  # the broker does not answer: blind
    proxy.cut(0)
    assert look(sas) == []  # sees again; the workers are reconnecting too
    pass_time(sas, sas.test_clock.now + 1.0, "a second")
    assert look(sas) == []
    pass_time(sas, sas.test_clock.now + 1.1, "two seconds seen")
    assert sorted(a.run_id for a in look(sas)) == sorted(runs)  # still silent: not draining


@pytest.mark.parametrize("silent", [6.0], indirect=True)  # the gap and the seeing again, in the steps' time
def test_a_supervisor_that_no_look_came_to_for_a_while_was_blind_meanwhile(silent):
    """With the broker down beat cannot send the looks, and none runs to find it down: the gap
    itself says the Supervisor could not see."""
    sas, _, runs = silent
    sas.test_clock.advance(2.1)  # no look for longer than SETTLE_S (and ten looks' interval): the outage
    assert look(sas) == []  # sees again
    seeing = sas.test_clock.now
    raised: list = []
    while not raised and sas.test_clock.now < seeing + 3:  # a look each interval, as the lookout takes them
        raised = look(sas)
    assert sorted(a.run_id for a in raised) == sorted(runs)
    assert sas.test_clock.now > seeing + 2.0  # once it had seen the queue silent for SETTLE_S


def test_the_steps_waiting_when_the_broker_stops_answering_are_told_in_their_last_look(silent):
    """Nothing is taken from a broker that is down, and its workers reconnect some time after it is
    back: the steps its queue held when the Supervisor last read it are at risk in their last look,
    whatever the queue's pace — those still running. (Looks sent through the broker never came then:
    a chaos run's backlog due in an outage's first seconds went untold.)"""
    sas, proxy, runs = silent
    proxy.cut(60)
    assert look(sas) == []  # blind, and none of them due before the next look
    with sas.store.begin() as tx:  # one of them was taken just before the broker went away, and completed
        tx.hot_path.complete_and_advance(runs[2], 0, 1, {}, "test")
    due = min(sas.store.get_steps(run_id)[0].complete_by for run_id in runs[:2])
    every = sas.settings.at_risk_interval
    pass_time(sas, due - 3.5 * every, "the steps' last looks but two")
    assert look(sas) == []  # due after the look after next: told in one of those
    found = look(sas)
    assert sorted(a.run_id for a in found) == sorted(runs[:2])
    assert all(a.reason.endswith("and the broker not answering on sas.agent.svc") for a in found), found


def test_steps_taken_before_the_broker_stopped_answering_are_not_told(silent):
    """A queue read empty holds none of the steps it held before: an outage after it tells none."""
    sas, proxy, runs = silent
    assert len(Pump(sas).take("sas.agent.svc")) == 3  # a worker took them (and works on them still)
    assert look(sas) == []
    proxy.cut(60)
    pass_time(sas, sas.store.get_steps(runs[0])[0].complete_by - 1.5 * sas.settings.at_risk_interval,
              "the steps' last look")
    assert look(sas) == []


def test_a_supervisor_worker_looks_at_the_queues_itself_while_the_broker_is_down(stack, stack_env, redis_url):
    """The looks are the Supervisor worker's own (no beat runs here), and go on while the broker is
    down for everyone: the orders' steps waiting then are told at risk before their complete-by."""
    redis_port, db = redis_url.rsplit(":", 1)[1].split("/")
    proxy = Proxy(int(redis_port))
    env = {**stack_env, "SAS_BROKER_URL": f"redis://127.0.0.1:{proxy.port}/{db}", "SAS_AT_RISK_INTERVAL": "0.1"}
    shop = shop_app(env, step_timeout=4.0)
    shop.migrate()
    stack.env.update(env)
    stack.worker("supervisor", "sas.scheduler,sas.supervisor")  # no agents, no beat
    try:
        handles = [shop.submit("order", {"amount": 5}, business_key=f"down-{i}") for i in range(2)]
        wait_for(lambda: all(s.state == "running" for h in handles for s in shop.store.get_steps(h.id)[:2]), 10,
                 "each order's first steps dispatched")
        # looks taken after the steps were dispatched (the store's clock) have read the queues holding
        # them (a look taken before, or none yet, would not have: the worker had just started)
        dispatched = max(s.complete_by - s.timeout for h in handles for s in shop.store.get_steps(h.id)[:2])
        wait_for(lambda: last_look(shop) > dispatched + 0.25, 5, "looks at the queues holding them")
        proxy.cut(60)  # the broker gone for everyone before the steps' last fifth
        wait_for(lambda: len(at_risk_alerts(shop)) == 4, 10, "each waiting step told at risk")
        due = {(s.run_id, s.position): s.complete_by for h in handles for s in shop.store.get_steps(h.id)[:2]}
        for alert in at_risk_alerts(shop):
            assert "and the broker not answering on sas.agent." in alert.reason, alert.reason
            assert alert.at < due[(alert.run_id, alert.position)]
    finally:
        proxy.close()
        shop.store.dispose()


def last_look(sas: SasApp) -> float:
    """When the Supervisor last took a look (the store's clock; 0 before its first)."""
    with sas.store.engine.connect() as conn:
        return float(conn.execute(select(looks.c.at)).scalar() or 0.0)


def at_risk_alerts(sas: SasApp) -> list:
    with sas.store.engine.connect() as conn:
        return list(conn.execute(select(alerts).where(alerts.c.kind == "at_risk")))
