"""An expense claim that waits for a manager: recorded in the ledger, then approved or rejected —
from the command line, the dashboard or another service — and paid out (or not); with no answer
within the approval window, the claim is voided.

Run it (with SAS_* set as for any sas_app process):
    SAS_APP=examples.approval:sas sas worker &
    SAS_APP=examples.approval:sas sas beat &
    python -m examples.approval             # submits a claim, approves it as its manager, prints the outcome
    python -m examples.approval --reject

A manager answers a waiting claim from anywhere:
    SAS_APP=examples.approval:sas sas signal expense_claim:claim-42 approval --payload '{"approved": true}'
or with the dashboard's Approve and Reject buttons (`sas dashboard --basic-auth user:password`), or
from a service that has only the broker:
    celery_app.send_task("sas.signal", queue="sas.scheduler",
                         kwargs={"workflow": "expense_claim", "business_key": "claim-42",
                                 "event": "approval", "payload": {"approved": True}})
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from typing import Any

from sas_app import AgentCall, OnTimeout, RunState, SasApp, Step, StepState, UndoCall, WaitFor, Workflow

sas = SasApp()
celery = sas.celery
ledger = sas.agent("ledger")

#: how long a claim waits for its manager (a day; shorter to try the timeout)
APPROVAL_WINDOW = float(os.environ.get("CLAIM_APPROVAL_WINDOW", 86400))


@ledger.action
def record_claim(call: AgentCall) -> dict[str, Any]:
    return {"claim": call.business_key, "employee": call.payload["employee"], "amount": call.payload["amount"]}


@ledger.undo
def void_claim(call: UndoCall) -> dict[str, Any]:
    return {"voided": call.business_key}


@ledger.action
def pay_out(call: AgentCall) -> dict[str, Any]:
    decision = call.result_of(approval)  # the signal's payload
    if decision.get("timed_out") or not decision.get("approved"):
        return {"paid": 0, "why": f"rejected by {decision.get('by', 'the manager')}"}
    return {"paid": call.payload["amount"], "to": call.payload["employee"]}


recording = Step("record_claim", record_claim, timeout=10, compensate=void_claim)
# waits in the store — no worker held — until a signal 'approval' comes, or the window ends
approval = WaitFor("manager_approval", "approval", timeout=APPROVAL_WINDOW, on_timeout=OnTimeout.COMPENSATE)
payment = Step("pay_out", pay_out, timeout=10)
claims = sas.register(Workflow("expense_claim", [recording, approval, payment],
                               description="an expense claim: recorded, approved by a manager, paid out"))


def main(approve: bool) -> int:
    key = f"claim-{uuid.uuid4().hex[:8]}"
    handle = sas.submit(claims, {"employee": "ann", "amount": 120.0}, business_key=key)
    deadline = time.monotonic() + 30
    while handle.status().step(approval).state != StepState.PENDING:  # recorded, now waiting
        if time.monotonic() > deadline:
            print(f"{key}: never reached its wait; are the worker and beat running?", file=sys.stderr)
            return 1
        time.sleep(0.1)
    print(f"{key}: waiting for approval")
    receipt = sas.signal(workflow=claims, business_key=key, event="approval",
                         payload={"approved": approve, "by": "bob"}, by="bob")
    view = handle.wait(timeout=60)
    paid = view.step(payment).result or {}
    outcome = f"paid {paid.get('paid')} to {paid['to']}" if paid.get("to") else f"paid nothing ({paid.get('why')})"
    print(f"{key}: signal {receipt.status}; {view.state}: {outcome}")
    return 0 if view.state is RunState.PROCESSED else 1


if __name__ == "__main__":
    sys.exit(main(approve="--reject" not in sys.argv[1:]))
