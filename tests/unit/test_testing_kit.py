"""sas_app's test kit (``sas_app.testing``) as a user meets it: their own app, run on the real
engine with a virtual clock — days of sleeps, waits and escalations in well under a second — with
agents stubbed to fail in every way a remote service does. On both stores: SQLite in a temporary
folder, and (as an integration test) a schema of its own in PostgreSQL, as ``--sas-database-url``
gives it."""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest

from sas_app import (
    AgentCall,
    Escalate,
    InvalidSignal,
    OnTimeout,
    PermanentError,
    RunState,
    SasApp,
    Settings,
    Sleep,
    Step,
    StepState,
    Then,
    TransientError,
    UndoCall,
    Undone,
    WaitFor,
    Workflow,
)
from sas_app.testing import HANG, WORKER_LOST, StubExhausted

pytestmark = pytest.mark.both_stores


@pytest.fixture
def sas_env(db_url, sas_env):
    """The kit's own fixture; on the PostgreSQL turn, its stores in that database."""
    return sas_env if db_url.startswith("sqlite") else partial(sas_env, database_url=db_url)


@pytest.fixture
def sas(tmp_path) -> SasApp:
    """A user's app, as their own module would make it: its agents, undos and workflows."""
    app = SasApp(Settings(database_url=f"sqlite:///{tmp_path / 'own.db'}", broker_url="memory://localhost/",
                          home=tmp_path / "home"))
    billing = app.agent("billing")
    mail = app.agent("mail")

    @billing.action
    def charge(call: AgentCall) -> dict[str, float]:
        return {"charged": call.payload["amount"]}

    @billing.undo
    def refund(call: UndoCall) -> dict[str, str]:
        return {"refunded": call.undoes.idempotency_key}

    @mail.action
    def notify(call: AgentCall) -> dict[str, bool]:
        return {"sent": True}

    charging = Step("charge", charge, timeout=10, compensate=refund)
    app.register(Workflow("subscription", [
        charging,
        Sleep("cooling_off", timedelta(days=3)),
        WaitFor("approval", "approval", timeout=timedelta(hours=2), on_timeout=OnTimeout.CONTINUE),
        Step("notify", notify, timeout=30, max_failures=2,
             on_exhausted=Escalate(wait=timedelta(hours=1), retries=1, then=Then.COMPENSATE)),
    ]))
    app.register(Workflow("charge_only", [charging]))
    app.register(Workflow("hold_then_charge", [Step("hold", charge, timeout=10), Step("charge", charge, timeout=10)]))
    app.register(Workflow("charge_each", [Step("each", charge, timeout=10, for_each="items")]))
    return app


def test_days_of_sleeping_waiting_and_escalating_pass_on_the_virtual_clock(sas, sas_env):
    """A three-day sleep, a two-hour wait that times out, then a mail service down through its
    escalation's hour: the charge is refunded — with no server and no real waiting."""
    env = sas_env(sas)
    env.stub("mail.notify", raises=TransientError("mail service unavailable"))
    started = env.now

    view = env.run("subscription", {"amount": 30.0})

    assert view.state is RunState.COMPENSATED
    assert env.now - started > timedelta(days=3, hours=3).total_seconds()
    assert view.step("approval").result == {"timed_out": True}
    [refund] = env.calls("billing.refund")
    assert refund.undoes == Undone("charge", f"{view.id}:charge") and refund.idempotency_key == f"{view.id}:charge:undo"
    assert sorted({c.attempt for c in env.calls("mail.notify")}) == [1, 2, 3]  # two, then one after the wait
    assert [a.kind for a in env.alerts] == ["escalated", "failed"]


def test_a_signal_ends_a_wait_and_the_clock_moves_only_when_asked(sas, sas_env):
    env = sas_env(sas)
    run = env.start("subscription", {"amount": 30.0})
    assert run.step("cooling_off").state == StepState.PENDING  # asleep in the store

    env.advance(timedelta(days=3, minutes=5))
    assert env.get_run(run).step("approval").state == StepState.PENDING  # now waiting for the signal
    env.signal(run, "approval", {"ok": True})

    view = env.finish(run)
    assert view.state is RunState.PROCESSED
    assert view.step("approval").result == {"ok": True}


def test_each_call_is_recorded_with_its_key_fencing_token_and_input(sas, sas_env):
    env = sas_env(sas)
    env.stub("billing.charge", sequence=[HANG, TransientError("busy"), {"charged": 1.0}])

    view = env.run("charge_only", {"amount": 1.0}, business_key="order-7")

    assert view.state is RunState.PROCESSED
    calls = env.calls("billing.charge")
    assert [(c.attempt, c.try_number) for c in calls] == [(1, 1), (2, 1), (2, 2)]
    assert {c.idempotency_key for c in calls} == {f"{view.id}:charge"}
    assert [c.fencing_token for c in calls] == [1, 2, 2]
    assert {(c.business_key, c.payload["amount"]) for c in calls} == {("order-7", 1.0)}
    assert calls[1].at - calls[0].at >= 10  # the retry came after the first attempt's complete-by


def test_a_worker_that_dies_mid_step_costs_the_step_one_attempt(sas, sas_env):
    env = sas_env(sas)
    env.stub("billing.charge", sequence=[WORKER_LOST, {"charged": 2.0}])

    view = env.run("charge_only", {"amount": 2.0})

    assert view.state is RunState.PROCESSED
    assert view.step("charge").attempt == 2
    assert any((e.detail or {}).get("reason") == "worker_lost" for e in view.events)


def test_a_worker_that_dies_in_a_step_after_one_of_the_same_agent_costs_that_step_one_attempt(sas, sas_env):
    env = sas_env(sas)
    env.stub("billing.charge", sequence=[{"held": 2.0}, WORKER_LOST, {"charged": 2.0}])

    view = env.run("hold_then_charge", {"amount": 2.0})

    assert view.state is RunState.PROCESSED
    assert [(s.name, s.attempt) for s in view.steps] == [("hold", 1), ("charge", 2)]
    assert [e.position for e in view.events if (e.detail or {}).get("reason") == "worker_lost"] == [1]


def test_a_permanent_fault_undoes_what_was_done(sas, sas_env):
    env = sas_env(sas)
    env.stub("mail.notify", raises=PermanentError("no such address"))
    env.stub("billing.charge", returns={"charged": 5.0})

    run = env.start("subscription", {"amount": 5.0})
    env.advance(timedelta(days=3, hours=2, minutes=1))  # through the sleep and the wait's timeout

    view = env.get_run(run)
    assert view.state is RunState.COMPENSATED
    assert len(env.calls("billing.refund")) == 1



def test_advancing_over_a_call_that_hangs_past_the_end_leaves_the_clock_where_the_call_took_it(sas, sas_env):
    """A call that hangs takes the clock to its complete-by; a stretch that ends before then
    still advances (it raised that the clock cannot go back), and the clock stays where it is."""
    env = sas_env(sas)
    env.stub("mail.notify", hangs=True)
    env.start("subscription", {"amount": 5.0})
    started = env.now
    env.advance(timedelta(days=3, hours=2, seconds=10))  # the wait times out at 2 h; notify hangs 30 s
    assert env.now >= started + timedelta(days=3, hours=2, seconds=29).total_seconds()
    assert [c.attempt for c in env.calls("mail.notify")] == [1]


def test_the_users_app_is_left_as_it_was(sas, sas_env, tmp_path):
    env = sas_env(sas)
    env.stub("billing.charge", raises=PermanentError("declined"))
    env.run("charge_only", {"amount": 1.0})

    assert not (tmp_path / "own.db").exists()  # the environment's store is its own
    assert env.app.store.count_runs_by_state() == {"error": 1}
    # the stub answers in the environment only: the app's own action still runs its function
    assert sas.agents["billing"].actions["charge"].fn(
        AgentCall("r", "k", "charge_only", "charge", 0, 1, "r:charge", {"amount": 3.0}, {}, 10.0)) == {"charged": 3.0}


def test_two_environments_side_by_side_share_no_store_and_no_message(sas, sas_env):
    one, two = sas_env(sas), sas_env(sas)
    handle = one.app.submit("charge_only", {"amount": 1.0}, business_key="side-1")  # its message not run yet
    two.settle()  # runs what is on its own broker only
    assert not one.get_run(handle.id).state.finished and one.calls() == two.calls() == []

    one.settle()
    assert one.get_run(handle.id).state is RunState.PROCESSED
    assert [c.payload for c in one.calls("billing.charge")] == [{"amount": 1.0}] and two.calls() == []
    assert two.app.store.find_run("charge_only", "side-1") is None


def test_bad_input_to_the_kit_is_an_error_that_names_it(sas, sas_env):
    env = sas_env(sas)
    with pytest.raises(KeyError, match=r"no action 'billing\.chrage'; it has"):
        env.stub("billing.chrage", returns={})
    with pytest.raises(ValueError, match="exactly one of"):
        env.stub("billing.charge", returns={}, hangs=True)
    with pytest.raises(ValueError, match="forward only"):
        env.advance(timedelta(seconds=-1))
    env.stub("billing.charge", hangs=True)
    live = env.start("charge_only", {"amount": 1.0})  # its charge not answered yet
    with pytest.raises(InvalidSignal, match="never waits for event 'approval'; it waits for no event"):
        env.signal(live, "approval", {})
    done = env.start("subscription", {"amount": 1.0})
    env.finish(done)
    with pytest.raises(InvalidSignal, match="it takes no more signals"):
        env.signal(done, "approval", {})

    env.stub("billing.charge", sequence=[TransientError("busy")])
    with pytest.raises(StubExhausted, match="ran out of answers: call 2"):
        env.run("charge_only", {"amount": 1.0})


def test_an_operator_resubmits_a_run_in_error_once_the_service_is_fixed(sas, sas_env):
    env = sas_env(sas)
    env.stub("billing.charge", raises=PermanentError("card expired"))
    failed = env.run("charge_only", {"amount": 4.0})
    assert failed.state is RunState.ERROR  # a first step that failed: nothing to undo

    env.unstub("billing.charge")
    env.app.resubmit(failed.id, by="ops", reason="card updated")

    view = env.finish(failed)
    assert view.state is RunState.PROCESSED
    assert view.step("charge").result == {"charged": 4.0}
    assert [c.attempt for c in env.calls("billing.charge")] == [1, 2]


def test_a_submitter_hears_of_each_step_of_its_run(sas, sas_env):
    env = sas_env(sas)

    view = env.run("charge_only", {"amount": 6.0}, reply_to="shop")

    kinds = [(note["run_id"], note["kind"]) for note in env.notifications("shop")]
    assert kinds[0] == (view.id, "received") and kinds[-1] == (view.id, "processed")
    assert env.notifications("shop") == env.notifications("shop")  # each once, kept in order


def test_a_stub_answers_each_call_from_the_call_itself(sas, sas_env):
    """One branch of a fan-out hangs on its first attempt, whichever order the branches run in."""
    env = sas_env(sas)
    env.stub("billing.charge", answer=lambda call: HANG if call.item == "b" and call.attempt == 1
             else {"charged": call.item})

    view = env.run("charge_each", {"items": ["a", "b", "c"]})

    assert view.state is RunState.PROCESSED
    assert view.step("each").result == [{"charged": "a"}, {"charged": "b"}, {"charged": "c"}]
    assert sorted((c.item, c.attempt) for c in env.calls("billing.charge")) == [("a", 1), ("b", 1), ("b", 2), ("c", 1)]


def test_returns_given_a_function_is_refused_naming_answer(sas, sas_env):
    env = sas_env(sas)
    with pytest.raises(ValueError, match=r"returns= is the value itself .* pass answer="):
        env.stub("billing.charge", returns=lambda call: {"charged": 1.0})


def test_the_calls_of_a_step_are_its_own_when_steps_share_an_action(sas, sas_env):
    env = sas_env(sas)
    view = env.run("hold_then_charge", {"amount": 2.0})
    holding = Step("hold", "billing.charge")  # as the user's module declares it

    assert [c.step for c in env.calls(holding)] == ["hold"]
    assert [c.step for c in env.calls("billing.charge")] == ["hold", "charge"]
    assert view.state is RunState.PROCESSED
    with pytest.raises(TypeError, match=r"an action .*, its name or a Step"):
        env.calls(42)  # type: ignore[arg-type]


def test_finishing_a_paused_run_says_it_is_paused_at_once(sas, sas_env):
    env = sas_env(sas)
    run = env.start("subscription", {"amount": 30.0})
    env.app.pause(run.id, by="ops")
    before = env.now

    with pytest.raises(AssertionError, match=f"run {run.id} \\(subscription\\) is paused by ops: resume it first"):
        env.finish(run)
    assert env.now == before  # no clock moved through virtual days in vain


def test_an_attempt_makes_the_same_tries_every_time(sas, sas_env):
    """No random jitter in the retries' waits: a test that counts calls counts the same each run."""
    seen = set()
    for _ in range(3):
        env = sas_env(sas)
        env.stub("billing.charge", raises=TransientError("down"))
        env.run("charge_only", {"amount": 1.0})
        calls = env.calls("billing.charge")
        first = {c.attempt: c.at for c in reversed(calls)}
        seen.add(tuple((c.attempt, c.try_number, round(c.at - first[c.attempt], 6)) for c in calls))
    assert len(seen) == 1, sorted(seen)  # the same tries, each as far into its attempt


def test_notifications_of_a_name_no_run_was_given_are_an_error_not_an_empty_list(sas, sas_env):
    env = sas_env(sas)
    env.run("charge_only", {"amount": 1.0}, reply_to="shop")
    assert [n["kind"] for n in env.notifications("shop")][-1] == "processed"
    with pytest.raises(KeyError, match=r"no run was submitted with reply_to 'shpo'; runs were with: \['shop'\]"):
        env.notifications("shpo")


def test_a_paused_run_that_is_cancelled_or_passes_its_deadline_still_finishes(sas, sas_env):
    """Paused is a stop only while the run would go on: once cancelled it is undone, paused or not,
    and its deadline undoes it too."""
    sas.register(Workflow("due_subscription", [
        Step("charge", "billing.charge", timeout=10, compensate="billing.refund"),
        Sleep("cooling_off", timedelta(days=3))], deadline=timedelta(hours=1)))
    env = sas_env(sas)
    env.stub("billing.refund", sequence=[HANG, {"refunded": "r-1"}, {"refunded": "r-2"}])  # the first undo hangs
    cancelled = env.start("subscription", {"amount": 1.0})
    env.app.pause(cancelled.id, by="ops")
    env.app.cancel(cancelled.id, by="ops")
    assert env.finish(cancelled).state is RunState.CANCELLED

    overdue = env.start("due_subscription", {"amount": 1.0})
    env.app.pause(overdue.id, by="ops")
    assert env.finish(overdue).state is RunState.COMPENSATED
