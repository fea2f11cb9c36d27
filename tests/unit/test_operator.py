"""Operator actions: resubmit, mark done, pause/resume, cancel, compensate — each allowed only in
the states that make sense, and each recorded with who and why."""

from __future__ import annotations

import pytest

from sas_app import AgentCall, EventKind, InvalidOperation, RunState, SasApp, Settings, Step, UnknownRun, Workflow
from sas_app.testing import Environment
from tests.support import expire
from tests.testapp import CALLS

# On SQLite here and, as integration tests, on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.both_stores


def operator_events(sas, run_id):
    return [(e.detail["action"], e.detail["by"], e.detail["reason"]) for e in sas.store.get_events(run_id)
            if e.kind == "operator"]


def test_resubmit_resumes_at_the_failed_step_not_from_the_start(sas, pump):
    handle = sas.submit("three", {"script": {"second": ["permanent", "ok"]}}, business_key="r1")
    pump.run()
    assert handle.status().process_state == "error"

    sas.resubmit(handle.id, by="alice", reason="card re-enabled")
    pump.run()

    view = handle.status()
    assert view.process_state == "processed"
    assert [(s.attempt, s.failure_count) for s in view.steps] == [(1, 0), (2, 0), (1, 0)]
    assert len(CALLS[view.step("first").idempotency_key]) == 1
    assert operator_events(sas, handle.id) == [("resubmit", "alice", "card re-enabled")]


def test_resubmit_with_an_edited_input(sas, pump):
    handle = sas.submit("three", {"script": {"second": ["permanent"]}}, business_key="r2")
    pump.run()

    sas.resubmit(handle.id, by="bob", reason="fixed the address", step="second", step_input={"fixed": True})
    pump.run()

    view = handle.status()
    assert view.process_state == "processed"
    assert view.step("second").input == {"fixed": True}


def test_mark_done_completes_a_failed_step_by_hand(sas, pump):
    handle = sas.submit("three", {"script": {"second": ["permanent"]}}, business_key="r3")
    pump.run()

    sas.mark_done(handle.id, "second", by="carol", reason="charged by phone", result={"manual": True})
    pump.run()

    view = handle.status()
    assert view.process_state == "processed"
    assert view.step("second").result == {"manual": True}


def test_operators_name_steps_by_the_objects_the_workflow_was_declared_with(sas, pump):
    first, second = Step("first", "svc.work", timeout=5), Step("second", "svc.work", timeout=5)
    sas.register(Workflow("by_object", [first, second, Step("third", "svc.work", timeout=5)]))
    resubmitted, marked = (sas.submit("by_object", {"script": {"second": ["permanent"]}}, business_key=key)
                           for key in ("o1", "o3"))
    pump.run()
    sas.resubmit(resubmitted.id, by="bob", step=second, step_input={"fixed": True})
    sas.mark_done(marked.id, second, by="carol", result={"manual": True})
    pump.run()
    again, by_hand = resubmitted.status(), marked.status()
    assert (again.process_state, again.step("second").input, again.step("second").attempt) == (
        "processed", {"fixed": True}, 2)
    assert (by_hand.process_state, by_hand.step("second").result) == ("processed", {"manual": True})

    live = sas.submit("by_object", {}, business_key="o2")
    state = sas.cancel(live.id, by="erin")
    assert state is RunState.CANCELLED and live.status().process_state == "cancelled"


def test_pause_stops_further_steps_until_resume(sas, pump):
    handle = sas.submit("three", {}, business_key="r4")
    pump.run(["sas.scheduler"])
    sas.pause(handle.id, by="dan", reason="investigating")
    pump.run()

    view = handle.status()
    assert view.process_state == "processing" and view.run.paused_by == "dan"
    assert [s.state for s in view.steps] == ["completed", "not_started", "not_started"]

    sas.resume(handle.id, by="dan", reason="all clear")
    asked = handle.status().run.complete_by  # by when the Scheduler must have looked at it
    assert asked == pytest.approx(sas.store.now() + sas.settings.pickup_timeout, abs=0.05)
    pump.run(["sas.scheduler"])
    assert handle.status().run.complete_by is None  # it looked: nothing for the sweep to ask again
    pump.run()
    assert handle.status().process_state == "processed"


def test_cancel_mid_run_undoes_what_was_done_and_ends_cancelled(sas, pump):
    handle = sas.submit("saga", {}, business_key="r5")
    pump.run(["sas.scheduler"])
    pump.run(["sas.agent.svc"])
    pump.run(["sas.scheduler"])  # first completed, second running

    assert sas.cancel(handle.id, by="erin", reason="customer asked") == "compensating"
    pump.run()

    view = handle.status()
    assert view.process_state == "cancelled"
    assert view.run.cancelled_by == "erin"
    # the running second step is undone too: its late reply would be fenced out
    assert [s.name for s in view.steps[3:]] == ["undo:second", "undo:first"]
    assert [s.state for s in view.steps[:3]] == ["compensated", "compensated", "not_started"]


def test_a_committed_cancel_is_not_reported_as_failed_when_the_broker_refuses_the_next_message(
        sas, pump, monkeypatch, caplog):
    handle = sas.submit("saga", {}, business_key="r5-broker-down")
    pump.run(["sas.scheduler"])
    pump.run(["sas.agent.svc"])
    pump.run(["sas.scheduler"])  # first completed, second running

    def refused(*args, **kwargs):
        raise ConnectionError("the broker is down")

    with monkeypatch.context() as broker_down:
        broker_down.setattr(sas.celery, "send_task", refused)
        assert sas.cancel(handle.id, by="erin", reason="customer asked") == "compensating"
    assert "it is committed, so the Supervisor will recover it" in caplog.text

    # the Supervisor asks again once the first undo's pick-up complete-by has passed
    expire(sas, handle.id)
    assert set(sas.supervisor.sweep().requeued) == {handle.id}
    pump.run()
    assert handle.status().process_state == "cancelled"


@pytest.mark.parametrize("end", ["cancel", "compensate"])
def test_replies_that_arrive_after_a_run_was_cancelled_or_compensated_change_nothing(sas, pump, end):
    handle = sas.submit("saga", {}, business_key=f"late-{end}")
    pump.run(["sas.scheduler"])
    pump.run(["sas.agent.svc"])
    pump.run(["sas.scheduler"])
    [in_flight] = pump.take("sas.agent.svc")  # the second step's message, held back
    getattr(sas, end)(handle.id, by="gil", reason="")
    pump.run()
    before = handle.status()
    assert before.process_state == {"cancel": "cancelled", "compensate": "compensated"}[end]

    pump.execute(in_flight)  # the agent runs at last and replies
    sas.scheduler.step_done(handle.id, 0, 1, {"late": True})
    sas.scheduler.step_failed(handle.id, 1, 1, "late error")
    sas.scheduler.step_lost(handle.id, 1, 1, "late report")
    sas.scheduler.advance(handle.id)
    pump.run()

    after = handle.status()
    assert (after.run, after.steps) == (before.run, before.steps)
    new = [e.kind for e in after.events[len(before.events):]]
    assert new == ["stale_reply"] * 4


def test_cancel_a_pending_run_with_nothing_done(sas, pump):
    handle = sas.submit("saga", {}, business_key="r6")
    assert sas.cancel(handle.id, by="fay", reason="") == "cancelled"
    pump.run()
    assert handle.status().process_state == "cancelled"
    assert all(s.attempt == 0 for s in handle.status().steps)


def test_compensate_now_undoes_a_processing_run(sas, pump):
    handle = sas.submit("saga", {}, business_key="r8")
    pump.run(["sas.scheduler"])
    sas.pause(handle.id, by="hal", reason="hold")
    pump.run()

    sas.compensate(handle.id, by="hal", reason="order void")
    pump.run()

    view = handle.status()
    assert view.process_state == "compensated"
    assert [s.name for s in view.steps[3:]] == ["undo:first"]


def test_resubmit_a_failed_undo_finishes_the_compensation(sas, pump):
    handle = sas.submit("saga", {"script": {"second": ["permanent"], "undo:first": ["permanent", "ok"]}},
                        business_key="r7")
    pump.run()
    assert handle.status().process_state == "error"

    sas.resubmit(handle.id, by="gus", reason="refund service back")  # the failed undo, resubmitted
    pump.run()
    assert handle.status().process_state == "compensated"


@pytest.mark.parametrize(
    ("action", "problem"),
    [
        (lambda sas, rid: sas.resubmit(rid, by="x"), "it is processed, not error"),
        (lambda sas, rid: sas.cancel(rid, by="x"), "cannot cancel run .*: it is processed"),
        (lambda sas, rid: sas.pause(rid, by="x"), "cannot pause run"),
        (lambda sas, rid: sas.resume(rid, by="x"), "cannot resume run"),
        (lambda sas, rid: sas.compensate(rid, by="x"), "cannot compensate run .*: it is processed"),
        (lambda sas, rid: sas.mark_done(rid, "nope", by="x"), "cannot mark a step of run .* done: it is processed"),
        (lambda sas, rid: sas.cancel(rid, by=""), "say who is acting"),
    ],
)
def test_actions_the_state_does_not_allow_are_refused_and_change_nothing(sas, pump, action, problem):
    handle = sas.submit("three", {}, business_key="done")
    pump.run()
    before = handle.status()

    with pytest.raises(InvalidOperation, match=problem):
        action(sas, handle.id)

    assert handle.status() == before


def test_an_unknown_run_is_a_clear_error(sas):
    with pytest.raises(UnknownRun, match="no run with id 'nope'"):
        sas.cancel("nope", by="x")


def test_a_paused_runs_step_is_left_alone_until_resume_not_asked_about_every_pick_up_time(tmp_path, db_url):
    """A paused run's step whose back-off is over waits for the run's resume, which asks the
    Scheduler about it: the Supervisor does not ask again every pick-up time meanwhile — 119
    requeue events, and as many messages, in a paused hour — nor does ``sas doctor`` call it
    overdue. Resumed, it runs."""
    user = SasApp(Settings(database_url=f"sqlite:///{tmp_path / 'own.db'}", broker_url="memory://localhost/",
                           home=tmp_path / "home"))
    held = user.agent("held")

    @held.action
    def work(call: AgentCall) -> int:
        return 1

    user.register(Workflow("held", [Step("work", work, timeout=30, max_failures=5)]))
    with Environment(user, database_url=None if db_url.startswith("sqlite") else db_url) as env:
        env.stub(work, hangs=True)
        run = env.start("held", {})
        env.app.pause(run.id, by="dan", reason="incident")
        env.unstub(work)
        requeued = sum(1 for e in env.get_run(run.id).events if e.kind == EventKind.REQUEUE.value)
        env.advance(3600)

        view = env.get_run(run.id)
        assert view.step("work").state == "pending" and view.run.paused_by == "dan"
        assert sum(1 for e in view.events if e.kind == EventKind.REQUEUE.value) == requeued
        assert env.app.store.overdue(60).count == 0
        env.app.resume(run.id, by="dan", reason="all clear")
        assert env.finish(run).process_state == "processed"
