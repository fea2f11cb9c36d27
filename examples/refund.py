"""A refund that takes one of two branches: a small one is approved by policy at once, a larger one
waits for a manager; either way it is paid (or not) by the same step, which runs once, with the
decision of whichever branch was taken. Its input is typed: a refund without a customer or with an
amount that is not positive is refused at the door, naming the field.

Run it (with SAS_* set as for any sas_app process):
    SAS_APP=examples.refund:sas sas worker &
    SAS_APP=examples.refund:sas sas beat &
    python -m examples.refund 20       # small: approved by policy, refunded at once
    python -m examples.refund 400      # large: waits for the manager, who approves it here
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from typing import Any

from pydantic import BaseModel, Field

from sas_app import AgentCall, OnTimeout, RunState, SasApp, Step, StepState, WaitFor, Workflow

sas = SasApp()
celery = sas.celery
billing = sas.agent("billing")

#: the largest refund approved without a manager
AUTO_LIMIT = float(os.environ.get("REFUND_AUTO_LIMIT", 50))
#: how long a large refund waits for its manager (two days)
APPROVAL_WINDOW = float(os.environ.get("REFUND_APPROVAL_WINDOW", 2 * 86400))


class Refund(BaseModel):
    """What a refund is submitted with (every way in validates it; each action gets it parsed)."""

    customer: str = Field(min_length=1)
    amount: float = Field(gt=0, le=10_000)
    reason: str = ""


@billing.action
def check_refund(call: AgentCall) -> dict[str, Any]:
    refund: Refund = call.payload
    return {"amount": refund.amount, "small": refund.amount <= AUTO_LIMIT}


@billing.action
def approve_by_policy(call: AgentCall) -> dict[str, Any]:
    return {"approved": True, "by": "policy"}


@billing.action
def pay_refund(call: AgentCall) -> dict[str, Any]:
    decision = call.result_of_any(by_policy, by_manager)  # the branch taken; the other was skipped
    if decision.get("timed_out") or not decision.get("approved"):
        return {"refunded": 0, "why": f"not approved by {decision.get('by', 'the manager')}"}
    refund: Refund = call.payload
    return {"refunded": refund.amount, "to": refund.customer, "by": decision["by"]}


checking = Step("check_refund", check_refund, timeout=10)
# an exclusive choice: the same key, `when=` on one branch and `unless=` on the other
by_policy = Step("approve_by_policy", approve_by_policy, timeout=10, when=checking.output("small"))
by_manager = WaitFor("manager_approval", "approval", timeout=APPROVAL_WINDOW, on_timeout=OnTimeout.CONTINUE,
                     after=[checking], unless=checking.output("small"))
# the join: it waits for both branches, runs once the one taken has completed
paying = Step("pay_refund", pay_refund, timeout=10, after=[by_policy, by_manager])
refunds = sas.register(Workflow("refund", [checking, by_policy, by_manager, paying], input=Refund,
                                description="a refund: approved by policy when small, else by a manager; paid"))


def main(amount: float) -> int:
    key = f"refund-{uuid.uuid4().hex[:8]}"
    handle = sas.submit(refunds, {"customer": "ann", "amount": amount}, business_key=key)
    deadline = time.monotonic() + 30
    while True:
        view = handle.status()
        if view.step(by_manager).state == StepState.PENDING:  # a large one, waiting: approve it
            print(f"{key}: waiting for a manager")
            sas.signal(handle.id, "approval", {"approved": True, "by": "bob"}, by="bob")
            break
        if view.state.finished or view.step(by_manager).state == StepState.SKIPPED:
            break
        if time.monotonic() > deadline:
            print(f"{key}: never got past its check; are the worker and beat running?", file=sys.stderr)
            return 1
        time.sleep(0.1)
    view = handle.wait(timeout=60)
    taken = "by policy" if view.step(by_policy).state == StepState.COMPLETED else "by a manager"
    print(f"{key}: {view.state}, approved {taken}: {view.step(paying).result}")
    return 0 if view.state is RunState.PROCESSED else 1


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0))
