"""User code as a type checker sees it: ``mypy --strict`` must accept this file, and each
``assert_type`` fails the check the day a decorator or a reference loses its type
(tests/unit/test_public_api.py runs it). Never imported by the suite; only checked."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, assert_type

from sas_app import (
    AgentAction,
    AgentCall,
    ChildRun,
    NotYet,
    OnTimeout,
    Output,
    Poll,
    RunHandle,
    RunState,
    SasApp,
    SignalReceipt,
    Sleep,
    Step,
    StepContext,
    StepRow,
    UndoAction,
    UndoCall,
    Undone,
    WaitFor,
    Workflow,
)
from sas_app.testing import Call, Environment

sas = SasApp()
payment = sas.agent("payment")


@payment.action
def charge(call: AgentCall) -> dict[str, str]:
    assert_type(call.try_number, int)
    return {"charge_id": call.idempotency_key}


@payment.action(name="quote")
def price(call: AgentCall) -> float:
    return 9.5


@payment.undo
def refund(call: UndoCall) -> dict[str, str]:
    assert_type(call.undoes, Undone)  # never None on an undo: no assert needed
    return {"refunded": call.undoes.idempotency_key}


@payment.action
async def authorise(call: AgentCall) -> dict[str, bool]:  # a coroutine: awaited by the agent
    return {"authorised": True}


@payment.undo
async def void(call: UndoCall) -> dict[str, str]:
    return {"voided": call.undoes.idempotency_key}


assert_type(charge, AgentAction[dict[str, str]])
assert_type(price, AgentAction[float])
assert_type(refund, UndoAction[dict[str, str]])
assert_type(authorise, AgentAction[dict[str, bool]])  # the awaited result, not the coroutine
assert_type(void, UndoAction[dict[str, str]])

@payment.action
def receipt_of(call: AgentCall) -> dict[str, Any]:
    assert_type(call.result_of(charging), Any)
    return {"charge": call.result_of(charging)["charge_id"]}


@payment.action
def settle(call: AgentCall) -> dict[str, str]:
    if call.poll < 2:  # the bank has not settled it yet: ask again in a minute
        raise NotYet(after=timedelta(minutes=1), detail="pending at the bank")
    return {"settled": call.idempotency_key}


settling = Step("settle", settle, timeout=10, poll=Poll(every=timedelta(minutes=1), max_wait=timedelta(hours=1)))
quoting = Step("quote", price, timeout=timedelta(seconds=5), after=[])
charging = Step("charge", charge, timeout=10, compensate=refund, after=[quoting])
assert_type(charging.output("items"), Output)
def large(step: StepContext) -> bool:
    return bool(step.result_of(quoting) > 100 and step.payload["amount"])


approval = WaitFor("approval", "approval", timeout=timedelta(days=1), on_timeout=OnTimeout.ERROR, when=large)
nap = Sleep("cool_off", timedelta(minutes=5))
receipt = Step("receipt", receipt_of, timeout=10, for_each=charging.output("items"),
               unless=charging.output("declined"))
orders = sas.register(Workflow("order", [quoting, charging, approval, nap, receipt]))
parent = Workflow("parent", [ChildRun("an_order", orders)])
handle = sas.submit(orders, {"amount": 1}, business_key="order-1")
assert_type(handle, RunHandle)


def watch(run_id: str) -> bool:
    view = sas.get_run(run_id)
    assert_type(view.state, RunState)
    assert_type(view.state.finished, bool)
    assert_type(view.step(charging), StepRow)
    receipt = sas.signal(run_id, "approval", {"approved": True})
    assert_type(receipt, SignalReceipt)
    by_key = sas.signal(workflow=orders, business_key="order-1", event="approval", payload={})
    assert_type(by_key, SignalReceipt)
    assert_type(sas.signal(run_id, approval, {"approved": True}), SignalReceipt)  # the wait itself
    sas.mark_done(run_id, charging, by="ops", result={"charge_id": "by hand"})
    sas.resubmit(run_id, by="ops", step=charging)
    assert_type(sas.cancel(run_id, by="ops"), RunState)
    return view.state is RunState.PROCESSED


def test_with_the_kit(env: Environment) -> None:
    env.stub(charge, returns={"charged": 1.0})
    view = env.run(orders, {"amount": 1.0})
    assert_type(view.state, RunState)
    assert_type(env.signal(view, approval, {"approved": True}), SignalReceipt)
    assert_type(env.calls(charge), list[Call])
    assert_type(env.now, float)



@payment.action(name="authorise_named")
async def authorise_named(call: AgentCall) -> dict[str, bool]:
    return {"authorised": True}


@payment.undo(name="void_named")
async def void_named(call: UndoCall) -> dict[str, str]:
    return {"voided": call.undoes.idempotency_key}


assert_type(authorise_named, AgentAction[dict[str, bool]])  # named, and still the awaited result
assert_type(void_named, UndoAction[dict[str, str]])
