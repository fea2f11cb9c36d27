"""Choices: a step that runs only when its condition holds, ends ``skipped`` otherwise, and what
follows a step not taken — the join after an exclusive choice runs once with the branch taken,
a step whose every dependency was skipped is skipped too, a skipped step is never undone, a
condition that raises stops the run for an operator. On SQLite and, as integration tests, on
PostgreSQL (where a completion in a graph takes the one-statement path)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from sas_app import AgentCall, PermanentError, RunState, SasApp, Settings, Step, StepContext, StepState, Workflow
from sas_app.cli.main import main
from sas_app.store.tables import alerts
from sas_app.testing import Environment
from sas_app.web.dashboard import create_dashboard
from tests.support import FakeClock

pytestmark = pytest.mark.both_stores


#: the deployment's settings that a condition reads (a test "deploys a fix" by setting one)
DEFAULTS: dict[str, float] = {}


def install(sas: SasApp) -> dict[str, Any]:
    shop = sas.agent("shop", retry_initial=0.01, retry_max=0.02)

    @shop.action
    def quote(call: AgentCall) -> dict[str, Any]:
        return {"express": bool(call.payload.get("express")), "price": 12}

    @shop.undo
    def release_quote(call: Any) -> dict[str, Any]:
        return {"released": call.undoes.step}

    @shop.action
    def ship(call: AgentCall) -> dict[str, Any]:
        return {"by": call.step, "tracking": f"T-{call.business_key}"}

    @shop.undo
    def recall(call: Any) -> dict[str, Any]:
        return {"recalled": call.undoes.step}

    @shop.action
    def notify(call: AgentCall) -> dict[str, Any]:
        if call.payload.get("fail_notify"):
            raise PermanentError("the mail service refused the address")
        return {"told": call.result_of_any("express", "standard")}

    @shop.action
    def work(call: AgentCall) -> dict[str, Any]:
        return {"step": call.step}

    quoting = Step("quote", quote, timeout=5, compensate=release_quote)
    express = Step("express", ship, timeout=5, after=[quoting], when=quoting.output("express"), compensate=recall)
    standard = Step("standard", ship, timeout=5, after=[quoting], unless=quoting.output("express"), compensate=recall)
    telling = Step("notify", notify, timeout=5, after=[express, standard])
    sas.register(Workflow("shipping", [quoting, express, standard, telling]))

    first = Step("first", work, timeout=5)
    gift = Step("wrap", work, timeout=5, when="gift")  # a payload key
    card = Step("card", work, timeout=5)  # after wrap: skipped with it
    sas.register(Workflow("optional", [first, gift, card, Step("close", work, timeout=5, after=[first, card])]))
    sas.register(Workflow("tail", [Step("first", work, timeout=5), Step("wrap", work, timeout=5, when="gift"),
                                   Step("card", work, timeout=5)]))

    def priced_high(step: StepContext) -> bool:
        limit = step.payload.get("limit", DEFAULTS.get("limit"))
        return bool(step.result_of("quote")["price"] > limit)  # TypeError with no limit at all

    sas.register(Workflow("review", [Step("quote", quote, timeout=5, compensate=release_quote),
                                     Step("cheap", work, timeout=5, after=["quote"], unless=priced_high),
                                     Step("review", work, timeout=5, after=["quote"], when=priced_high),
                                     Step("done", work, timeout=5, after=["cheap", "review"])]))
    return {"quote": quote, "ship": ship, "notify": notify, "recall": recall, "release_quote": release_quote,
            "work": work}


@pytest.fixture
def shop(settings: Settings, db_url: str) -> Iterator[tuple[Environment, dict[str, Any]]]:
    user = SasApp(settings)
    actions = install(user)
    with Environment(user, clock=FakeClock(), database_url=None if db_url.startswith("sqlite") else db_url) as env:
        yield env, actions


def states(view: Any) -> dict[str, tuple[str, str | None]]:
    return {s.name: (s.state, s.error) for s in view.steps}


@pytest.mark.parametrize("express, taken, skipped, condition", [
    (True, "express", "standard", "unless quote.express"),
    (False, "standard", "express", "when quote.express"),
])
def test_an_exclusive_choice_takes_one_branch_and_its_join_runs_once_with_that_result(
        shop, express, taken, skipped, condition):
    env, a = shop
    view = env.run("shipping", {"express": express}, business_key="o1")

    assert view.process_state == RunState.PROCESSED, view.run.error
    found = states(view)
    assert found[taken] == (StepState.COMPLETED, None)
    assert found[skipped] == (StepState.SKIPPED, f"`{condition}` did not hold")
    assert [c.step for c in env.calls(a["ship"])] == [taken]  # the branch not taken was never called
    [told] = env.calls(a["notify"])
    assert set(told.results) == {"quote", taken}
    assert view.step("notify").result == {"told": {"by": taken, "tracking": "T-o1"}}
    skip_events = [e for e in view.events if e.to_state == StepState.SKIPPED]
    assert [(e.from_state, e.detail) for e in skip_events] == [
        (StepState.NOT_STARTED, {"reason": f"`{condition}` did not hold"})]


def test_undoing_after_a_taken_branch_leaves_the_skipped_branch_alone(shop):
    env, a = shop
    view = env.run("shipping", {"express": True, "fail_notify": True}, business_key="o2")

    assert view.process_state == RunState.COMPENSATED
    assert [c.undoes.step for c in env.calls(a["recall"])] == ["express"]
    assert [c.undoes.step for c in env.calls(a["release_quote"])] == ["quote"]
    assert view.step("standard").state == StepState.SKIPPED
    assert [s.name for s in view.steps if s.is_undo] == ["undo:express", "undo:quote"]


def test_a_step_whose_every_dependency_was_skipped_is_skipped_and_a_join_goes_on(shop):
    env, a = shop
    view = env.run("optional", {"gift": False}, business_key="g1")

    assert view.process_state == RunState.PROCESSED
    assert states(view) == {
        "first": (StepState.COMPLETED, None),
        "wrap": (StepState.SKIPPED, "`when gift` did not hold"),
        "card": (StepState.SKIPPED, "every step it waits for was skipped (wrap)"),
        "close": (StepState.COMPLETED, None),  # waits for first (completed) and card (skipped)
    }
    assert [c.step for c in env.calls(a["work"])] == ["first", "close"]

    gift = env.run("optional", {"gift": "yes"}, business_key="g2")
    assert [s.state for s in gift.steps] == [StepState.COMPLETED] * 4


def test_a_run_whose_remaining_steps_are_all_skipped_is_processed(shop):
    env, a = shop
    view = env.run("tail", {}, business_key="t1")  # no "gift" key: reads as false

    assert view.process_state == RunState.PROCESSED
    assert [s.state for s in view.steps] == [StepState.COMPLETED, StepState.SKIPPED, StepState.SKIPPED]
    assert [c.step for c in env.calls(a["work"])] == ["first"]


def test_a_condition_written_as_a_function_decides_on_the_payload_and_earlier_results(shop):
    env, _ = shop
    high = env.run("review", {"limit": 10}, business_key="r1")
    low = env.run("review", {"limit": 100}, business_key="r2")

    assert [(s.name, s.state) for s in high.steps] == [
        ("quote", "completed"), ("cheap", "skipped"), ("review", "completed"), ("done", "completed")]
    assert high.step("cheap").error == "`unless install.priced_high()` did not hold"
    assert [(s.name, s.state) for s in low.steps] == [
        ("quote", "completed"), ("cheap", "completed"), ("review", "skipped"), ("done", "completed")]


def test_a_condition_that_raises_stops_the_run_in_error_with_one_alert_and_starts_nothing(shop):
    env, a = shop
    view = env.run("review", {}, business_key="r3")  # no limit anywhere: priced_high raises

    assert view.process_state == RunState.ERROR
    reason = "step 'cheap': its condition `unless install.priced_high()` raised TypeError"
    assert view.run.error.startswith(reason)
    assert [(s.name, s.state) for s in view.steps] == [
        ("quote", "completed"), ("cheap", "failed"), ("review", "not_started"), ("done", "not_started")]
    assert [c.step for c in env.calls(a["work"])] == []  # neither branch was called
    with env.app.store.engine.connect() as conn:
        raised = conn.execute(select(alerts.c.reason).where(alerts.c.run_id == view.id)).scalars().all()
    assert len(raised) == 1 and raised[0].startswith(reason)

    DEFAULTS["limit"] = 100  # the cause fixed; the operator resubmits the step: its condition is asked again
    try:
        env.app.resubmit(view.id, by="ops", reason="default limit deployed")
        fixed = env.finish(view.id)
    finally:
        DEFAULTS.clear()
    assert fixed.process_state == RunState.PROCESSED
    assert [(s.name, s.state) for s in fixed.steps] == [
        ("quote", "completed"), ("cheap", "completed"), ("review", "skipped"), ("done", "completed")]


def test_a_run_whose_condition_changed_since_it_started_stops_in_error(shop):
    env, a = shop
    env.stub(a["quote"], hangs=True)
    run = env.start("review", {"limit": 10}, business_key="r4")
    assert run.step("quote").state != StepState.COMPLETED  # the conditions are not decided yet
    changed = env.app.workflows["review"]
    env.app.workflows["review"] = Workflow("review", [
        s if s.guard is None else type(s)(**{**s.__dict__, "guard": None}) for s in changed.specs])

    env.unstub(a["quote"])
    view = env.finish(run)

    assert view.process_state == RunState.ERROR
    assert "is not in the deployed code" in view.step("cheap").error


#: the app `sas show` loads here (``--app tests.unit.test_choices:SHOWN``)
SHOWN: SasApp | None = None


def test_sas_show_and_the_dashboard_show_a_skipped_step_its_condition_and_why(shop):
    global SHOWN
    env, _ = shop
    view = env.run("shipping", {"express": True}, business_key="o3")
    SHOWN = env.app

    shown = CliRunner().invoke(main, ["--app", "tests.unit.test_choices:SHOWN", "show", view.id],
                               env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    [row] = [line for line in shown.output.splitlines() if "│ standard " in line]
    assert "quote · unless quote.express" in row and "skipped" in row
    assert "`unless quote.express` did not hold" in row

    page = create_dashboard(env.app).test_client().get(f"/runs/{view.id}").get_data(as_text=True)
    lane = page.split('data-step="standard"')[1].split("</tr>")[0]
    assert "quote · unless quote.express" in lane and ">skipped</span>" in lane
    assert '<div class="muted note">`unless quote.express` did not hold</div>' in lane
