"""Durable polling: a step whose action answers "not yet" waits in the store and is asked again,
with the same idempotency key and a poll count, until it answers, fails, or passes its max_wait.
On SQLite and, as integration tests, on PostgreSQL; real workers restarted between polls are in
tests/integration/test_polling_workers.py."""

from __future__ import annotations

from itertools import pairwise

import pytest
from sqlalchemy import select

from sas_app import NotYet, Poll, RunState, SasApp, Step, StepState, Workflow, WorkflowDefinitionError
from sas_app.store.tables import alerts
from sas_app.testing import Environment
from tests.testapp import CALLS

pytestmark = pytest.mark.both_stores


def test_a_polling_step_is_asked_again_until_its_job_is_done_with_one_key_and_a_poll_count(
        env: Environment, sas: SasApp):
    started = env.now
    view = env.run("poller", {"script": {"check": ["not_yet", "not_yet", "not_yet", "ok"]}})

    assert view.process_state == RunState.PROCESSED
    check = view.step("check")
    assert (check.state, check.polls, check.failure_count) == (StepState.COMPLETED, 3, 0)
    calls = [c for c in env.calls("svc.work") if c.step == "check"]
    assert [(c.attempt, c.poll) for c in calls] == [(1, 0), (2, 1), (3, 2), (4, 3)]
    assert {c.idempotency_key for c in calls} == {check.idempotency_key}
    assert [round(b.at - a.at) for a, b in pairwise(calls)] == [30, 30, 30]  # each 30 s later
    assert env.now - started >= 90
    waits = [e for e in view.events
             if e.position == check.position and e.kind == "transition" and e.to_state == StepState.PENDING]
    assert [e.detail["not_yet"] for e in waits] == [1, 2, 3]
    assert [e.detail["message"] for e in waits] == ["poll 0", "poll 1", "poll 2"]


def test_between_polls_the_step_waits_in_the_store_holding_no_message(env: Environment, sas: SasApp):
    run = env.start("poller", {"script": {"check": ["not_yet", "ok"]}})

    check = run.step("check")
    assert check.state == StepState.PENDING and check.polls == 1
    assert check.not_before == check.complete_by  # the sweep asks about it then, on the database's clock
    assert check.not_before - env.now == pytest.approx(30, abs=1)
    assert env.pump.take("sas.agent.svc") == [] and env.pump.take("sas.scheduler") == []
    assert sas.store.next_due(sas.settings.pickup_timeout) == pytest.approx(check.not_before)
    assert env.finish(run).process_state == RunState.PROCESSED


def test_a_job_not_done_by_max_wait_fails_the_step_with_one_alert_and_the_run_is_undone(
        env: Environment, sas: SasApp):
    started = env.now
    view = env.run("poller", {"script": {"check": ["not_yet"]}})

    assert view.process_state == RunState.COMPENSATED
    check = view.step("check")
    assert check.state == StepState.FAILED
    assert check.error.startswith("step 'check': its job was not done 600 s after its first 'not yet' (max_wait)")
    assert check.polls == 20  # every 30 s from the first "not yet"; the 21st call, at max_wait, answered too
    assert env.now - started >= 600
    assert [c.undoes.step for c in env.calls("svc.undo")] == ["start"]
    with sas.store.engine.connect() as conn:
        raised = conn.execute(select(alerts.c.kind).where(alerts.c.run_id == view.id)).scalars().all()
    assert raised == ["failed"]


def test_a_step_that_does_not_poll_and_answers_not_yet_fails_naming_the_mistake(env: Environment):
    view = env.run("saga", {"script": {"second": ["not_yet"]}})

    assert view.process_state == RunState.COMPENSATED
    assert "its action answered 'not yet' (NotYet), but the step does not poll: give it poll=Poll(every, " \
           "max_wait)" in view.step("second").error


def test_a_late_not_yet_is_fenced_out(env: Environment, sas: SasApp):
    run = env.start("poller", {"script": {"check": ["not_yet", "ok"]}})
    check = run.step("check")
    sas.scheduler.step_not_yet(run.id, check.position, check.attempt, 5.0)  # the same reply, delivered twice

    again = env.get_run(run).step("check")
    assert (again.state, again.polls, again.not_before) == (StepState.PENDING, 1, check.not_before)
    assert sas.store.count_events("stale_reply", run.id) == 1


def test_not_yet_takes_a_positive_interval_only(env: Environment):
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match=r"NotYet\(after=\.\.\.\) must be a positive number"):
            NotYet(after=bad)  # type: ignore[arg-type]
    assert NotYet().after is None and NotYet(after=2).after == 2.0


@pytest.mark.parametrize("poll, problem", [
    (Poll(every=0, max_wait=60), "Poll every must be more than 0 seconds"),
    (Poll(every=-5, max_wait=60), "Poll every must be more than 0 seconds"),
    (Poll(every=60, max_wait=30), "Poll max_wait must be at least every (60 s)"),
    (Poll(every=60, max_wait=31 * 86400), "and at most 2.592e+06 seconds (SAS_MAX_SLEEP)"),
])
def test_a_poll_interval_or_max_wait_out_of_bounds_is_refused_at_registration(sas: SasApp, poll, problem):
    with pytest.raises(WorkflowDefinitionError, match=problem.replace("(", r"\(").replace(")", r"\)")
                       .replace("+", r"\+")):
        sas.register(Workflow("bad_poll", [Step("check", "svc.work", timeout=1, poll=poll)]))
    with pytest.raises(WorkflowDefinitionError, match="a fan-out's branches cannot poll yet"):
        sas.register(Workflow("bad_poll", [Step("check", "svc.work", timeout=1, for_each="items",
                                                poll=Poll(every=1, max_wait=5))]))
    assert "bad_poll" not in sas.workflows
    assert CALLS is not None
