"""The agent base: retries transient faults within complete-by, replies once, or stays silent."""

from __future__ import annotations

import time

import httpx
import pytest
from celery.exceptions import Reject
from sqlalchemy import create_engine

from sas_app import AgentCall, PermanentError, SasApp, Settings, StaleAttempt, Step, TransientError, Workflow
from sas_app.agents.agent import STORE_DOWN_PAUSE
from sas_app.testing.pump import Pump
from tests.support import wait_for


def message(**overrides):
    base = {
        "run_id": "r1", "business_key": "b1", "workflow": "wf", "step": "s", "position": 0,
        "attempt": 1, "idempotency_key": "r1:s", "payload": {}, "results": {},
        "complete_by": time.time() + 5, "budget": 5.0,
    }
    return {**base, **overrides}


@pytest.fixture
def agent(sas):
    return sas.agent("ext", retry_initial=0.01, retry_max=0.05, breaker_fail_max=0)


def run(sas, agent, fn, **overrides):
    action = agent.action(fn, name=f"a{len(agent.actions)}")
    sas.celery.tasks[f"sas.agent.ext.{action.name}"].run(**message(**overrides))


def test_a_success_reply_says_whether_the_run_notifies_as_its_message_said(sas, agent, pump):
    """The Scheduler sends a narrower statement for a run that notifies no one; the agent only
    hands back what the step's message said (a message without it: no one, which the statement
    checks)."""
    run(sas, agent, lambda call: "ok", notify=True)
    run(sas, agent, lambda call: "ok", run_id="r2")
    told = {reply.kwargs["run_id"]: reply.kwargs["notify"] for reply in pump.take("sas.scheduler")}
    assert told == {"r1": True, "r2": False}


def test_transient_faults_are_retried_with_the_same_key_and_token(sas, agent, pump):
    seen = []

    def flaky(call: AgentCall):
        seen.append((call.headers(), call.attempt, call.try_number))
        if len(seen) < 3:
            raise TransientError("busy") if len(seen) == 1 else httpx.ConnectError("refused")
        return {"ok": len(seen)}

    run(sas, agent, flaky, attempt=4)

    # the same attempt (the fencing token) throughout; the try number counts the in-process retries
    assert seen == [({"Idempotency-Key": "r1:s", "X-Fencing-Token": "4"}, 4, n) for n in (1, 2, 3)]
    [reply] = pump.take("sas.scheduler")
    assert (reply.task, reply.kwargs) == ("sas.scheduler.step_done",
                                          {"run_id": "r1", "position": 0, "attempt": 4, "result": {"ok": 3},
                                           "notify": False, "results": {}, "workflow": "wf",
                                           "faults": {"count": 2, "first": "busy",
                                                      "last": ["ConnectError: refused"]}})


def test_a_step_that_goes_smoothly_replies_without_faults(sas, agent, pump):
    run(sas, agent, lambda call: {"ok": call.try_number})
    [reply] = pump.take("sas.scheduler")
    assert reply.kwargs["result"] == {"ok": 1} and "faults" not in reply.kwargs


def test_an_attempt_s_faults_are_kept_bounded_the_first_and_the_last_few(sas, agent, pump):
    def flaky(call: AgentCall):
        if call.try_number <= 20:
            raise TransientError(f"busy {call.try_number}")
        return {"ok": True}

    agent.retry_initial = agent.retry_max = 0.001
    run(sas, agent, flaky)

    [reply] = pump.take("sas.scheduler")
    assert reply.kwargs["faults"] == {"count": 20, "first": "busy 1", "last": ["busy 18", "busy 19", "busy 20"]}


def test_a_database_that_dropped_the_connection_is_a_transient_fault(sas, agent, pump, tmp_path):
    # An action that writes to a database (the order example's confirm) meets a restarted server.
    engine = create_engine(f"sqlite:///{tmp_path / 'gone' / 'no.db'}")
    seen = []

    def writes(call: AgentCall):
        seen.append(call.attempt)
        if len(seen) == 1:
            with engine.connect():  # the folder does not exist: "unable to open database file"
                pass
        return {"written": True}

    run(sas, agent, writes)

    assert len(seen) == 2
    [reply] = pump.take("sas.scheduler")
    assert (reply.task, reply.kwargs["result"]) == ("sas.scheduler.step_done", {"written": True})


def test_past_complete_by_the_agent_stops_with_no_reply_but_its_faults(sas, agent, pump):
    calls = []

    def always_busy(call: AgentCall):
        calls.append(call.remaining())
        raise TransientError("still busy")

    started = time.monotonic()
    run(sas, agent, always_busy, budget=0.3)

    assert time.monotonic() - started < 1.0
    assert len(calls) > 1
    # no reply (the Supervisor retries the step at its complete-by), only its faults for its history
    [note] = pump.take("sas.scheduler")
    assert note.task == "sas.scheduler.step_faults"
    assert note.kwargs["faults"]["count"] == len(calls) and note.kwargs["faults"]["first"] == "still busy"


def test_a_result_that_comes_after_complete_by_is_not_sent(sas, agent, pump):
    """Not the result — the step is the Supervisor's by then — but word that this agent took the
    attempt and gave up on it, so that the Supervisor counts it a failed attempt."""
    run(sas, agent, lambda call: sas.test_clock.advance(0.25) or {"late": True}, budget=0.2)
    [word] = pump.take("sas.scheduler")
    assert word.task == "sas.scheduler.step_faults" and word.kwargs["gave_up"] is True
    assert "result" not in word.kwargs and "faults" not in word.kwargs


def test_a_result_in_time_is_sent_however_long_the_worker_took_to_get_to_it(sas, agent, pump):
    # The budget runs on the app's clock (injected here, standing still), not the host's: a
    # loaded test machine does not make a step late.
    run(sas, agent, lambda call: time.sleep(0.25) or {"ok": True}, budget=0.2)
    [reply] = pump.take("sas.scheduler")
    assert reply.kwargs["result"] == {"ok": True}


def test_a_permanent_fault_is_replied_as_an_error_at_once(sas, agent, pump):
    calls = []

    def declined(call):
        calls.append(1)
        raise PermanentError("card declined")

    run(sas, agent, declined)

    assert len(calls) == 1
    [reply] = pump.take("sas.scheduler")
    assert reply.task == "sas.scheduler.step_failed" and reply.kwargs["error"] == "card declined"


def test_a_superseded_attempt_stops_silently(sas, agent, pump):
    def stale(call):
        raise StaleAttempt("the service saw attempt 3")

    run(sas, agent, stale)
    assert pump.take("sas.scheduler") == []


def test_an_unexpected_exception_is_reported_not_retried(sas, agent, pump):
    calls = []

    def buggy(call):
        calls.append(1)
        return {}["missing"]

    run(sas, agent, buggy)

    assert len(calls) == 1
    [reply] = pump.take("sas.scheduler")
    assert reply.task == "sas.scheduler.step_failed" and reply.kwargs["error"].startswith("KeyError")


def test_a_result_that_is_not_json_is_reported(sas, agent, pump):
    run(sas, agent, lambda call: {"when": object()})
    [reply] = pump.take("sas.scheduler")
    assert reply.task == "sas.scheduler.step_failed" and "not JSON serializable" in reply.kwargs["error"]


@pytest.mark.parametrize("broken", [{"run_id": None, "attempt": "x"}, {"budget": -1}, {"attempt": 0}])
def test_a_malformed_message_is_dropped_with_a_logged_reason(sas, agent, pump, caplog, broken):
    calls = []
    msg = message(**broken)
    if broken.get("run_id", "") is None:
        del msg["run_id"]
    action = agent.action(lambda call: calls.append(1), name="guarded")
    sas.celery.tasks["sas.agent.ext.guarded"].run(**msg)

    assert calls == []
    assert pump.take("sas.scheduler") == []
    assert "rejected a malformed message" in caplog.text
    assert action.qualname == "ext.guarded"


def test_one_step_retried_in_process_cannot_open_the_breaker(sas, pump):
    guarded = sas.agent("flaky", retry_initial=0.001, retry_max=0.002, breaker_fail_max=3, breaker_reset=5)
    tries: dict[str, int] = {}

    def flaky(call: AgentCall):
        tries[call.run_id] = call.try_number
        if call.run_id == "r1" and call.try_number <= 5:
            raise TransientError("gateway timeout")
        return {"ok": call.run_id}

    guarded.action(flaky)
    task = sas.celery.tasks["sas.agent.flaky.flaky"]
    task.run(**message(run_id="r1", budget=2.0))
    task.run(**message(run_id="r2", budget=2.0))

    assert guarded.breaker.state == "closed"
    assert tries == {"r1": 6, "r2": 1}
    replies = pump.take("sas.scheduler")
    assert [(r.task, r.kwargs["run_id"]) for r in replies] == [("sas.scheduler.step_done", "r1"),
                                                               ("sas.scheduler.step_done", "r2")]
    assert replies[0].kwargs["faults"]["count"] == 5


def test_distinct_steps_failing_in_a_row_open_the_breaker_then_steps_are_deferred_uncalled(sas, pump):
    guarded = sas.agent("down", retry_initial=0.01, retry_max=0.02, breaker_fail_max=3, breaker_reset=0.5)
    calls = []

    def down(call: AgentCall):
        calls.append((call.run_id, call.try_number))
        raise TransientError("503")

    guarded.action(down)
    task = sas.celery.tasks["sas.agent.down.down"]
    for run_id in ("r1", "r2", "r3", "r4"):
        task.run(**message(run_id=run_id, budget=0.2))

    # r1 and r2 retried until their complete-by (their failures counted once each); r3's first
    # failure was the third in a row: open, r3 deferred at once and r4 never called
    assert [run_id for run_id, n in calls if n == 1] == ["r1", "r2", "r3"]
    assert [run_id for run_id, _ in calls].count("r3") == 1
    assert guarded.breaker.state == "open"
    replies = pump.take("sas.scheduler")
    assert [(r.task, r.kwargs["run_id"]) for r in replies] == [
        ("sas.scheduler.step_faults", "r1"), ("sas.scheduler.step_faults", "r2"),
        ("sas.scheduler.step_deferred", "r3"), ("sas.scheduler.step_deferred", "r4")]
    assert all(0 < r.kwargs["delay"] <= 0.5 for r in replies[2:])
    # the deferral of the call that opened it carries that call's fault
    assert replies[2].kwargs["faults"] == {"count": 1, "first": "503", "last": []}


def test_after_the_reset_timeout_one_probe_closes_the_breaker(sas, pump):
    guarded = sas.agent("wobbly", retry_initial=0.01, retry_max=0.02, breaker_fail_max=2, breaker_reset=0.3)

    def sometimes(call: AgentCall):
        if call.run_id in ("r1", "r2"):  # down for these two, then back
            raise TransientError("503")
        return {"ok": call.run_id}

    guarded.action(sometimes)
    task = sas.celery.tasks["sas.agent.wobbly.sometimes"]
    task.run(**message(run_id="r1", budget=0.1))
    task.run(**message(run_id="r2", budget=2.0))
    assert guarded.breaker.state == "open"
    wait_for(lambda: guarded.breaker.open_for() == 0, 2, "the breaker's reset timeout")

    task.run(**message(run_id="r3", budget=2.0))

    assert guarded.breaker.state == "closed"
    replies = pump.take("sas.scheduler")
    assert [(r.task, r.kwargs["run_id"]) for r in replies] == [("sas.scheduler.step_faults", "r1"),
                                                               ("sas.scheduler.step_deferred", "r2"),
                                                               ("sas.scheduler.step_done", "r3")]


def test_the_database_s_clock_falls_back_to_its_last_offset_then_to_nothing(sas, monkeypatch):
    """While the database cannot be asked, the offset measured last serves for up to an hour;
    past that the store's clock is unknown."""
    store = sas.store
    store.CLOCK_CHECK_INTERVAL = 0.0  # measured again at every read
    sas.test_clock.now = time.time() + 42  # the database's clock 42 s ahead of this host's
    assert store.db_clock() == pytest.approx(time.time() + 42, abs=0.5)

    def refused():
        raise ConnectionRefusedError("the database does not answer")

    monkeypatch.setattr(store, "now", refused)
    assert store.db_clock() == pytest.approx(time.time() + 42, abs=0.5)
    store.CLOCK_OFFSET_KEPT = 0.0
    assert store.db_clock() is None


def test_a_step_is_not_run_while_the_database_s_clock_cannot_be_read(sas, pump):
    """Its time left cannot be judged (its message may have waited past its complete-by): the
    action is not called and nothing is replied; its message goes back to the queue (Celery's
    Reject, requeued), for when the store answers — dropping it would spend an attempt."""
    paused = []
    blind = sas.agent("blind", db_clock=lambda: None, sleep=paused.append)
    seen = []
    action = blind.action(lambda call: seen.append(call.attempt), name="act")
    with pytest.raises(Reject) as rejected:
        sas.celery.tasks[f"sas.agent.blind.{action.name}"].run(**message())
    assert rejected.value.requeue and paused == [STORE_DOWN_PAUSE]
    assert seen == [] and pump.take("sas.scheduler") == []

    able = sas.agent("able", db_clock=lambda: time.time())
    action = able.action(lambda call: seen.append(call.attempt), name="act")
    sas.celery.tasks[f"sas.agent.able.{action.name}"].run(**message())
    assert seen == [1] and [m.task for m in pump.take("sas.scheduler")] == ["sas.scheduler.step_done"]


def test_a_step_taken_over_from_a_reply_goes_to_its_queue_while_the_database_s_clock_cannot_be_read(tmp_path):
    """The worker that completed a step runs the next one of its agent itself, with no message of
    its own. If the database's clock cannot be read then, that step's message is published to the
    agent's queue, to run once the store answers — rejecting the task would hand back the first
    step's message (already done: dropped), leaving the next step for the Supervisor at its
    complete-by."""
    # replies handled in the agent's process, and the next step of the same agent run there
    sas = SasApp(Settings(database_url=f"sqlite:///{tmp_path / 'state.db'}", broker_url="memory://localhost/",
                          home=tmp_path / "home", inline_replies=True, eager_steps=8))
    sas.migrate()
    clock_readable = [True]
    blinking = sas.agent("blinking", db_clock=lambda: sas.store.db_clock() if clock_readable[0] else None,
                         sleep=lambda seconds: None)
    seen = []

    def first(call: AgentCall) -> dict:
        seen.append(call.step)
        clock_readable[0] = False  # the store blinks once this step has run
        return {}

    def second(call: AgentCall) -> dict:
        seen.append(call.step)
        return {}

    sas.register(Workflow("blink", [Step("a", blinking.action(first, name="first"), timeout=30),
                                    Step("b", blinking.action(second, name="second"), timeout=30)]))
    pump = Pump(sas)
    try:
        run = sas.submit("blink", {}, business_key="blink-1")
        pump.run(["sas.scheduler"])
        [message] = pump.take("sas.agent.blinking")
        pump.execute(message)  # no Reject: the task returns

        assert seen == ["a"]
        [resent] = pump.take("sas.agent.blinking")
        assert (resent.task, resent.kwargs["position"], resent.kwargs["attempt"]) == (
            "sas.agent.blinking.second", 1, 1)
        clock_readable[0] = True
        pump.execute(resent)
        pump.run(["sas.scheduler"])
        view = sas.get_run(run.id)
        assert seen == ["a", "b"] and view.process_state == "processed"
        assert [(s.name, s.attempt) for s in view.steps] == [("a", 1), ("b", 1)]
    finally:
        pump.close()
        sas.store.dispose()
