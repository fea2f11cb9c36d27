"""``async def`` actions and undos: awaited on the worker thread's event loop, cancelled at their
step's complete-by, and otherwise replied, fenced and retried exactly as plain ones (here on the
test kit: the real agent code, the action's coroutine run for real)."""

from __future__ import annotations

import asyncio

import pytest

from sas_app import AgentCall, PermanentError, RunState, SasApp, Settings, Step, TransientError, UndoCall, Workflow

#: what the actions saw, by what happened
SEEN: dict[str, list[object]] = {}


@pytest.fixture
def sas(tmp_path) -> SasApp:
    SEEN.clear()
    app = SasApp(Settings(home=tmp_path / "home", broker_url="memory://localhost/"))
    svc = app.agent("svc", retry_initial=0.01, retry_max=0.02)

    @svc.action
    async def fetch(call: AgentCall) -> dict[str, object]:
        plan = call.payload.get("plan", {})
        if plan.get("hang_until_attempt", 0) >= call.attempt:
            try:
                await asyncio.sleep(30)  # a remote call that never answers
            except asyncio.CancelledError:
                SEEN.setdefault("cancelled", []).append(call.attempt)
                raise
        if call.try_number <= plan.get("busy_tries", 0):
            raise TransientError("busy")
        if call.try_number <= plan.get("own_timeouts", 0):
            await asyncio.wait_for(asyncio.sleep(1), 0.001)  # the action's own time-out
        if plan.get("refuse"):
            raise PermanentError("refused")
        await asyncio.sleep(0)
        return {"attempt": call.attempt, "try": call.try_number}

    @svc.undo
    async def unfetch(call: UndoCall) -> dict[str, str]:
        await asyncio.sleep(0)
        SEEN.setdefault("undone", []).append(call.undoes.step)
        return {"undone": call.undoes.step}

    @svc.action
    def plain(call: AgentCall) -> dict[str, bool]:
        return {"ok": True}

    first = Step("first", plain, timeout=5, compensate=unfetch)
    app.register(Workflow("fetching", [Step("fetch", fetch, timeout=0.3, max_failures=3)]))
    app.register(Workflow("undone", [first, Step("fetch", fetch, timeout=0.3, max_failures=1)]))
    return app


def test_an_async_action_s_result_is_its_steps(sas, sas_env):
    env = sas_env(sas)
    view = env.run("fetching", {})
    assert view.state is RunState.PROCESSED
    assert view.step("fetch").result == {"attempt": 1, "try": 1}


def test_a_hung_async_action_is_cancelled_at_complete_by_and_retried_as_a_new_attempt(sas, sas_env):
    env = sas_env(sas)
    view = env.run("fetching", {"plan": {"hang_until_attempt": 1}})
    assert view.state is RunState.PROCESSED
    assert SEEN["cancelled"] == [1]  # the call held the slot until its complete-by only
    assert view.step("fetch").result == {"attempt": 2, "try": 1}
    assert [e for e in view.events if e.kind == "faults"] == []  # expired, not a fault retried in-process


@pytest.mark.parametrize("plan", [{"busy_tries": 2}, {"own_timeouts": 1}], ids=["transient", "its own time-out"])
def test_an_async_action_s_transient_faults_are_retried_within_the_attempt(sas, sas_env, plan):
    env = sas_env(sas)
    view = env.run("fetching", {"plan": plan})
    assert view.state is RunState.PROCESSED
    tries = 1 + max(plan.values())
    assert view.step("fetch").result == {"attempt": 1, "try": tries}


def test_an_async_undo_undoes_when_an_async_step_fails_for_good(sas, sas_env):
    env = sas_env(sas)
    view = env.run("undone", {"plan": {"refuse": True}})
    assert view.state is RunState.COMPENSATED
    assert SEEN["undone"] == ["first"]
