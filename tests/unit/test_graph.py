"""Steps side by side and their join, and a step fanned out over a list: what starts when, what
each agent is told, and what is undone when a branch fails. On SQLite here and, as integration
tests, on PostgreSQL (where a branch's completion takes the general path, not the one statement)."""

from __future__ import annotations

import pytest

from sas_app import SasApp, Step, Workflow
from sas_app.errors import WorkflowDefinitionError
from tests.support import Pump, sweep_after_expiry
from tests.testapp import CALLS, scripted

pytestmark = pytest.mark.both_stores


def dispatched(pump: Pump) -> list:
    """The agent messages waiting once the Scheduler has caught up (taken off the queue), by step name."""
    pump.run(["sas.scheduler"])
    return sorted(pump.take("sas.agent.svc"), key=lambda m: m.kwargs["step"])


def test_steps_side_by_side_start_together_and_their_join_starts_once_after_both(sas, pump):
    handle = sas.submit("diamond", {}, business_key="d1")
    first = dispatched(pump)
    assert [m.kwargs["step"] for m in first] == ["left", "right"]  # both at once

    pump.execute(first[0])
    pump.run(["sas.scheduler"])
    assert pump.take("sas.agent.svc") == []  # the join waits for right
    pump.execute(first[1])
    pump.execute(first[1])  # a duplicate reply changes nothing
    pump.run(["sas.scheduler"])
    [join] = dispatched(pump)
    assert join.kwargs["step"] == "join"
    assert set(join.kwargs["results"]) == {"left", "right"}  # the join sees both results
    pump.execute(join)
    pump.run()

    view = handle.status()
    assert view.process_state == "processed"
    assert [(s.name, s.state, s.attempt) for s in view.steps] == [
        ("left", "completed", 1), ("right", "completed", 1), ("join", "completed", 1), ("last", "completed", 1)]
    assert sas.store.count_events("stale_reply", handle.id) == 1
    assert view.run.version and not view.run.linear


def test_a_for_each_step_runs_one_branch_per_item_never_more_than_max_parallel(sas, pump):
    items = [{"sku": f"s{i}"} for i in range(5)]
    handle = sas.submit("fanout", {"items": items}, business_key="f1")
    [prepare] = dispatched(pump)
    pump.execute(prepare)
    most = 0
    while waiting := dispatched(pump):
        running = [s for s in handle.status().steps if s.branch_of is not None and s.state == "running"]
        most = max(most, len(running))
        assert len([m for m in waiting if m.kwargs.get("index") is not None]) == len(running) <= 2
        for message in reversed(waiting):  # the later branch finishes first
            pump.execute(message)

    view = handle.status()
    assert view.process_state == "processed", view.run.error
    assert most == 2
    branches = [s for s in view.steps if s.branch_of is not None]
    assert [(b.name, b.branch, b.item) for b in branches] == [(f"ship[{i}]", i, items[i]) for i in range(5)]
    assert [b.idempotency_key for b in branches] == [f"{handle.id}:ship:{i}" for i in range(5)]
    ship = view.step("ship")
    assert ship.state == "completed"
    assert [r["item"] for r in ship.result] == items  # in order, whatever order they finished in
    confirm_key = view.step("confirm").idempotency_key
    assert CALLS[confirm_key] == [(1, "ok")]


def test_for_each_over_an_earlier_result_and_over_an_empty_list(sas, pump):
    handle = sas.submit("fanout_result", {"items_from_result": ["a", "b", "c"]}, business_key="fr1")
    pump.run()
    view = handle.status()
    assert view.process_state == "processed"
    assert [r["item"] for r in view.step("ship").result] == ["a", "b", "c"]

    empty = sas.submit("fanout", {"items": []}, business_key="f-empty")
    pump.run()
    view = empty.status()
    assert view.process_state == "processed"
    assert view.step("ship").result == []


@pytest.mark.parametrize("payload, reason", [
    ({}, "the payload has no key 'items'"),
    ({"items": "abc"}, "the payload's 'items' is a str, not a list"),
    ({"items": list(range(4))}, "4 elements, over the bound of 3 branches"),
])
def test_a_for_each_whose_list_is_missing_or_wrong_fails_and_dispatches_nothing(sas, pump, payload, reason):
    object.__setattr__(sas.settings, "max_branches", 3)
    handle = sas.submit("fanout", payload, business_key="f-bad")
    pump.run()
    view = handle.status()
    ship = view.step("ship")
    assert ship.state == "failed" and reason in ship.error
    assert [s for s in view.steps if s.branch_of is not None] == []
    assert view.process_state == "compensated"  # prepare, which ran, is undone
    assert [s.name for s in view.steps if s.compensates is not None] == ["undo:prepare"]
    assert sas.store.count_events("alert", handle.id) == 1


def test_a_branch_failing_for_good_stops_its_siblings_and_undoes_what_completed(sas, pump):
    script = {"ship[1]": ["permanent"], "ship[2]": ["hang"]}
    handle = sas.submit("fanout", {"items": [1, 2, 3, 4], "script": script}, business_key="f-fail")
    [prepare] = dispatched(pump)
    pump.execute(prepare)
    first = dispatched(pump)
    assert [m.kwargs["step"] for m in first] == ["ship[0]", "ship[1]"]
    pump.execute(first[0])  # ship[0] completes, and ship[2] starts (it will hang)
    [third] = dispatched(pump)
    assert third.kwargs["step"] == "ship[2]"
    pump.execute(first[1])  # ship[1] fails for good
    pump.run()

    view = handle.status()
    assert view.process_state == "compensated"
    states = {s.name: s.state for s in view.steps}
    assert states["ship[0]"] == "compensated" and states["ship[1]"] == "failed"
    assert states["ship[2]"] == "compensated"  # it was running: its effect may have happened
    assert states["ship[3]"] == "not_started" and states["ship"] == "stopped"
    assert [s.name for s in view.steps if s.compensates is not None] == ["undo:ship[2]", "undo:ship[0]", "undo:prepare"]
    assert sas.store.count_events("alert", handle.id) == 1
    sweep_after_expiry(sas, pump, handle.id)  # nothing of the stopped fan-out comes back
    assert handle.status().process_state == "compensated"
    assert not CALLS.get(view.step("ship[3]").idempotency_key)


def test_an_expired_branch_is_recovered_like_a_step_and_the_join_still_happens(sas, pump):
    handle = sas.submit("fanout", {"items": [1, 2], "script": {"ship[0]": ["hang", "ok"]}}, business_key="f-exp")
    sweep_after_expiry(sas, pump, handle.id, times=2)
    view = handle.status()
    assert view.process_state == "processed"
    assert view.step("ship[0]").attempt == 2
    assert CALLS[view.step("confirm").idempotency_key] == [(1, "ok")]


def test_a_run_keeps_the_graph_it_started_with_and_a_removed_action_fails_its_step(sas, pump, settings):
    handle = sas.submit("diamond", {}, business_key="v1")
    version = handle.status().run.version
    assert len(dispatched(pump)) == 2  # left and right are in flight when the new code is deployed

    # The next deployment: "diamond" has changed (no join, a new step) and svc.undo is gone.
    new = SasApp(sas.settings, clock=sas.test_clock)
    svc = new.agent("svc")
    svc.action(scripted, name="work")
    new.workflow("diamond", [Step("only", "svc.work", timeout=0.3)])
    assert new.workflows["diamond"].run_version != version
    for step in ("left", "right"):
        new.scheduler.step_done(handle.id, handle.status().step(step).position, 1, {})
    [join] = Pump(new).take("sas.agent.svc")
    assert join.kwargs["step"] == "join"  # the old graph, not the new one
    Pump(new).execute(join)
    Pump(new).run()
    view = handle.status()
    assert view.process_state == "processed" and view.run.version == version

    gone = sas.submit("saga", {"script": {"second": ["permanent"]}}, business_key="v2")
    [first] = dispatched(pump)
    Pump(new).execute(first)
    Pump(new).run()  # second fails: undoing first needs svc.undo, which this code no longer has
    view = gone.status()
    undo = view.step("undo:first")
    assert undo.state == "failed" and "'svc.undo' is not in the deployed code" in undo.error
    assert view.process_state == "error"
    assert sas.store.count_events("alert", gone.id) == 2  # the step's failure, then the undo's


@pytest.mark.parametrize("steps, message", [
    ([Step("a", "svc.work"), Step("b", "svc.work", after=["nope"])], "after names 'nope', which is not a step"),
    ([Step("a", "svc.work", after=["b"]), Step("b", "svc.work")], "in a cycle: "),
    ([Step("a", "svc.work", after=["a"])], "'a' waits for itself"),
    ([Step("a", "svc.work"), Step("b", "svc.work", after=["a", "a"])], "after names a step twice"),
    ([Step("a", "svc.work"), Step("b", "svc.work", for_each="zzz.items")], "names no step of this workflow"),
    ([Step("a", "svc.work"), Step("b", "svc.work", after=[], for_each="a.items")], "which it does not wait for"),
    ([Step("a", "svc.work", for_each="items", max_parallel=0)], "max_parallel must be an integer >= 1"),
    ([Step("a", "svc.work", for_each="items.x.y")], "for_each must name a payload key"),
])
def test_a_graph_that_cannot_run_is_refused_when_registered(sas, steps, message):
    with pytest.raises(WorkflowDefinitionError, match=message.replace("(", r"\(")):
        sas.register(Workflow("bad", steps))
    assert "bad" not in sas.workflows


def test_an_operator_resubmits_a_failed_branch_and_the_run_completes(sas, pump):
    script = {"ship[1]": ["permanent", "ok"]}
    handle = sas.submit("fanout_result", {"items_from_result": ["a", "b", "c"], "script": script},
                        business_key="op-resubmit")
    pump.run()
    view = handle.status()
    assert view.process_state == "error" and view.step("ship[1]").state == "failed"

    sas.resubmit(handle.id, by="ops", reason="the warehouse fixed the SKU", step="ship[1]")
    sweep_after_expiry(sas, pump, handle.id)  # a sibling whose reply came while the run was in error
    view = handle.status()
    assert view.process_state == "processed"
    assert [r["item"] for r in view.step("ship").result] == ["a", "b", "c"]


def test_an_operator_marks_one_branch_done_by_hand(sas, pump):
    script = {"ship[0]": ["permanent"]}
    handle = sas.submit("fanout_result", {"items_from_result": ["a", "b"], "script": script},
                        business_key="op-mark")
    pump.run()
    assert handle.status().process_state == "error"

    sas.mark_done(handle.id, "ship[0]", by="ops", reason="shipped by hand", result={"by": "hand"})
    sweep_after_expiry(sas, pump, handle.id)
    view = handle.status()
    assert view.process_state == "processed"
    assert view.step("ship").result[0] == {"by": "hand"}


def test_cancelling_a_run_with_branches_in_flight_undoes_them_and_fences_their_replies(sas, pump):
    handle = sas.submit("fanout", {"items": [1, 2, 3]}, business_key="op-cancel")
    [prepare] = dispatched(pump)
    pump.execute(prepare)
    in_flight = dispatched(pump)
    assert [m.kwargs["step"] for m in in_flight] == ["ship[0]", "ship[1]"]

    assert sas.cancel(handle.id, by="ops", reason="customer called") == "compensating"
    for message in in_flight:  # the agents were already at work: their replies are fenced out
        pump.execute(message)
    pump.run()

    view = handle.status()
    assert view.process_state == "cancelled"
    assert sorted(s.name for s in view.steps if s.compensates is not None) == [
        "undo:prepare", "undo:ship[0]", "undo:ship[1]"]
    assert view.step("undo:prepare").position == max(s.position for s in view.steps)  # undone last
    assert view.step("ship[2]").state == "not_started" and view.step("ship").state == "stopped"
    assert sas.store.count_events("stale_reply", handle.id) == 2


def test_a_run_in_flight_when_the_store_is_upgraded_keeps_running(settings, db_url):
    """A run written by the previous version (schema 0004: no graph columns) is mid-way when the
    store is migrated; the new code finishes it as the straight line it was."""
    from sqlalchemy import create_engine, text

    from sas_app.store.migrate import migrate
    from tests.testapp import install_test_workflows

    migrate(settings.database_url, "0004")
    engine = create_engine(settings.database_url)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO runs (id, workflow, business_key, payload, process_state, failure_count, priority,"
            " created_at, updated_at) VALUES ('r0004', 'three', 'old-1', '{}', 'processing', 0, 5, 1, 1)"))
        for position, name, state, attempt in ((0, "first", "completed", 1), (1, "second", "running", 1),
                                               (2, "third", "not_started", 0)):
            conn.execute(text(
                "INSERT INTO steps (run_id, position, name, agent, action, state, attempt, timeout, max_failures,"
                " failure_count, idempotency_key, created_at, updated_at, complete_by) VALUES ('r0004', :p, :n,"
                " 'svc', 'work', :s, :a, 30, 3, 0, :k, 1, 1, 4102444800)"),
                {"p": position, "n": name, "s": state, "a": attempt, "k": f"r0004:{name}"})
    engine.dispose()

    migrate(settings.database_url)
    app = SasApp(settings)
    install_test_workflows(app)
    Pump(app).purge()
    try:
        app.scheduler.step_done("r0004", 1, 1, {"late": "reply"})  # the old agent's reply
        Pump(app).run()
        view = app.get_run("r0004")
        assert view.process_state == "processed"
        assert [(s.name, s.state) for s in view.steps] == [
            ("first", "completed"), ("second", "completed"), ("third", "completed")]
        assert view.run.linear and view.run.version is None
    finally:
        app.store.dispose()


def test_a_fan_out_refused_for_its_list_is_resubmitted_with_an_edited_input(sas, pump):
    sas.register(Workflow("fan_only", [Step("ship", "svc.work", timeout=0.3, for_each="items")]))
    handle = sas.submit("fan_only", {"order": 1}, business_key="fan-edit")
    pump.run()
    view = handle.status()
    assert view.process_state == "error" and "has no key 'items'" in view.step("ship").error

    sas.resubmit(handle.id, by="ops", reason="the items came by mail", step="ship", step_input={"items": ["a", "b"]})
    pump.run()
    view = handle.status()
    assert view.process_state == "processed"
    assert [r["item"] for r in view.step("ship").result] == ["a", "b"]


def test_a_straight_line_whose_next_action_was_removed_fails_that_step_once_the_one_before_completes(
        sas, pump, env):
    # On PostgreSQL the reply completes "a" and starts "b" in one statement that commits on its
    # own; "b"'s action is then found gone, and "b" fails in a transaction of its own.
    sas.agent("svc").action(scripted, name="gone")
    sas.workflow("moved", [Step("a", "svc.work", timeout=0.3, compensate="svc.undo"),
                           Step("b", "svc.gone", timeout=0.3)])
    handle = sas.submit("moved", {}, business_key="m1", reply_to="shop")
    [a] = dispatched(pump)

    new = SasApp(sas.settings, clock=sas.test_clock)  # the next deployment: svc.gone is gone
    svc = new.agent("svc")
    svc.action(scripted, name="work")
    svc.undo(scripted, name="undo")
    new.workflow("moved", [Step("a", "svc.work", timeout=0.3, compensate="svc.undo"),
                           Step("b", "svc.work", timeout=0.3)])
    Pump(new).execute(a)
    Pump(new).run()

    view = handle.status()
    b = view.step("b")
    assert b.state == "failed" and "'svc.gone' is not in the deployed code" in b.error and b.attempt == 1
    assert view.step("a").state == "compensated" and view.process_state == "compensated"
    assert len(CALLS[view.step("a").idempotency_key + ":undo"]) == 1  # "a" undone, once
    assert sas.store.count_events("alert", handle.id) == 1
    # the submitter hears it in the order it happened: "a" completed, then the run is undone
    told = [(note["kind"], note.get("step")) for note in env.notifications("shop")]
    assert told == [("received", None), ("processing", None), ("step_completed", "a"), ("compensating", None),
                    ("step_undone", "undo:a"), ("compensated", None)], told
