"""The refund example, tested with sas_app's kit: both branches of its choice, and the join after them."""

from datetime import timedelta

import pytest

from examples.refund import (
    APPROVAL_WINDOW,
    approve_by_policy,
    by_manager,
    by_policy,
    paying,
    refunds,
    sas,
)
from sas_app import InvalidSubmission, RunState, StepState


def test_a_small_refund_is_approved_by_policy_and_paid_without_a_manager(sas_env):
    env = sas_env(sas)

    view = env.run(refunds, {"customer": "ann", "amount": 20})

    assert view.state is RunState.PROCESSED
    assert view.step(by_policy).state == StepState.COMPLETED
    assert view.step(by_manager).state == StepState.SKIPPED  # never waited
    assert view.step(paying).result == {"refunded": 20.0, "to": "ann", "by": "policy"}


def test_a_large_refund_waits_for_its_manager_and_is_paid_once_approved(sas_env):
    env = sas_env(sas)
    refund = env.start(refunds, {"customer": "ann", "amount": 400})
    assert refund.step(by_manager).state == StepState.PENDING  # waiting, no worker held
    assert refund.step(by_policy).state == StepState.SKIPPED

    env.advance(timedelta(hours=3))
    env.signal(refund, "approval", {"approved": True, "by": "bob"})

    view = env.finish(refund)
    assert view.step(paying).result == {"refunded": 400.0, "to": "ann", "by": "bob"}
    assert env.calls(approve_by_policy) == []


def test_a_large_refund_nobody_answers_is_not_paid(sas_env):
    env = sas_env(sas)
    started = env.now

    view = env.run(refunds, {"customer": "ann", "amount": 400})

    assert view.state is RunState.PROCESSED
    assert env.now - started >= APPROVAL_WINDOW
    assert view.step(by_manager).result == {"timed_out": True}
    assert view.step(paying).result == {"refunded": 0, "why": "not approved by the manager"}


def test_a_refund_without_a_customer_or_with_a_negative_amount_is_refused_naming_both(sas_env):
    env = sas_env(sas)
    with pytest.raises(InvalidSubmission) as refused:
        env.start(refunds, {"customer": "", "amount": -5})
    assert "customer: String should have at least 1 character" in str(refused.value)
    assert "amount: Input should be greater than 0" in str(refused.value)
    assert env.app.store.list_runs() == []  # nothing written
