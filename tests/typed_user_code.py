"""User code as a type checker sees it: ``mypy --strict`` must accept this file, and each
``assert_type`` fails the check the day a decorator or a reference loses its type
(tests/unit/test_public_api.py runs it). Never imported by the suite; only checked."""

from __future__ import annotations

from typing import assert_type

from sas_app import (
    AgentAction,
    AgentCall,
    RunState,
    SasApp,
    SignalReceipt,
    Step,
    UndoAction,
    UndoCall,
    Undone,
    Workflow,
)

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


assert_type(charge, AgentAction[dict[str, str]])
assert_type(price, AgentAction[float])
assert_type(refund, UndoAction[dict[str, str]])

orders = Workflow("order", [Step("charge", charge, timeout=10, compensate=refund)])
sas.register(orders)


def watch(run_id: str) -> bool:
    view = sas.get_run(run_id)
    assert_type(view.state, RunState)
    receipt = sas.signal(run_id, "approval", {"approved": True})
    assert_type(receipt, SignalReceipt)
    by_key = sas.signal(workflow=orders, business_key="order-1", event="approval", payload={})
    assert_type(by_key, SignalReceipt)
    return view.state is RunState.PROCESSED
