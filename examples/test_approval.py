"""The expense-claim example, tested with sas_app's kit: a day's approval window in milliseconds."""

from datetime import timedelta

from examples.approval import APPROVAL_WINDOW, approval, claims, pay_out, payment, record_claim, sas, void_claim
from sas_app import RunState, StepState
from sas_app.testing import HANG


def test_an_approved_claim_is_paid_out(sas_env):
    env = sas_env(sas)
    claim = env.start(claims, {"employee": "ann", "amount": 120.0})
    assert claim.step(approval).state == StepState.PENDING  # waiting for its manager, no worker held

    env.advance(timedelta(hours=5))
    env.signal(claim, "approval", {"approved": True, "by": "bob"})

    view = env.finish(claim)
    assert view.state is RunState.PROCESSED
    assert view.step(payment).result == {"paid": 120.0, "to": "ann"}


def test_a_rejected_claim_pays_nothing(sas_env):
    env = sas_env(sas)
    claim = env.start(claims, {"employee": "ann", "amount": 120.0})

    env.signal(claim, "approval", {"approved": False, "by": "bob"})

    assert env.finish(claim).step(payment).result == {"paid": 0, "why": "rejected by bob"}


def test_a_claim_nobody_answers_is_voided_when_its_window_ends(sas_env):
    env = sas_env(sas)
    started = env.now

    view = env.run(claims, {"employee": "ann", "amount": 120.0})

    assert view.state is RunState.COMPENSATED
    assert env.now - started >= APPROVAL_WINDOW  # a day passed, on the virtual clock
    assert [call.undoes.step for call in env.calls(void_claim)] == ["record_claim"]
    assert env.calls(pay_out) == []


def test_an_answer_that_comes_before_the_claim_waits_is_kept_for_its_wait(sas_env):
    env = sas_env(sas)
    env.stub(record_claim, sequence=[HANG, {"claim": "claim-early", "employee": "ann", "amount": 120.0}])
    claim = env.start(claims, {"employee": "ann", "amount": 120.0}, business_key="claim-early")
    assert claim.step(approval).state == StepState.NOT_STARTED  # the ledger has not answered yet

    env.signal(claim, "approval", {"approved": True, "by": "bob"})

    view = env.finish(claim)
    assert view.state is RunState.PROCESSED
    assert view.step(payment).result == {"paid": 120.0, "to": "ann"}
    assert [call.attempt for call in env.calls(record_claim)] == [1, 2]
