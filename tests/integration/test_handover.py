"""The next step of a straight line on the same agent, run by the worker that completed the step
before it: no message for it, the same transitions in the store, each step once — and, where its
timeout would outlast the message it would run under, or with ``SAS_EAGER_STEPS=0``, through the
broker as before. A worker that dies in a step it took this way leaves no message to redeliver:
the Supervisor finds the step at its complete-by and it runs again, the steps before it not — and
the first step's message, unacknowledged until the whole sequence returns and so delivered again,
is dropped unrun."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from sas_app.messaging.routing import dispatch_task_id
from tests.integration.graph_app import calls
from tests.support import wait_for

pytestmark = pytest.mark.integration

APP = {"SAS_APP": "tests.integration.graph_app:sas"}


def start(stack, env: dict[str, str] | None = None) -> None:
    stack.worker("scheduler", "sas.scheduler,sas.supervisor", env=APP, wait=False)
    stack.worker("agents", "sas.agent.work", 2, env={**APP, **(env or {})}, wait=False)
    stack.beat(env=APP, wait=False)
    stack.wait_ready()


def tasks_of(home: Path, run_id: str) -> dict[str, str]:
    """The Celery task each step of ``run_id`` ran under, by step name (one call each)."""
    mine = [c for c in calls(home) if c["key"].startswith(f"{run_id}:")]
    assert Counter(c["key"] for c in mine).most_common(1)[0][1] == 1, mine  # no step called twice
    return {c["key"].split(":")[1]: c["task"] for c in mine}


def test_three_steps_of_one_agent_run_under_the_first_step_s_message(stack, app, stack_env):
    start(stack)
    views = [app.submit("line", {}, business_key=f"line-{i}").wait(30) for i in range(3)]
    home = Path(stack_env["SAS_HOME"])
    for view in views:
        assert view.process_state == "processed"
        assert [(s.name, s.state, s.attempt) for s in view.steps] == [(n, "completed", 1) for n in "abc"]
        first = dispatch_task_id(view.id, 0, 1)
        assert tasks_of(home, view.id) == {"a": first, "b": first, "c": first}
        # the store went through the same transitions: each step marked running, then completed
        moves = [(e.position, e.to_state) for e in view.events if e.position is not None and e.kind == "transition"]
        assert moves == [(p, s) for p in range(3) for s in ("running", "completed")]


def test_with_eager_steps_off_each_step_has_its_message(stack, app, stack_env):
    start(stack, {"SAS_EAGER_STEPS": "0"})
    view = app.submit("line", {}, business_key="line-off").wait(30)
    assert view.process_state == "processed"
    assert tasks_of(Path(stack_env["SAS_HOME"]), view.id) == {
        name: dispatch_task_id(view.id, p, 1) for p, name in enumerate("abc")}


def test_a_step_whose_timeout_outlasts_the_message_it_would_run_under_has_its_own(stack, app, stack_env):
    start(stack)  # b's timeout (6 s) would end after the soft time limit of a's message (3 s + 1)
    view = app.submit("line_longer", {}, business_key="line-longer").wait(30)
    assert view.process_state == "processed"
    assert tasks_of(Path(stack_env["SAS_HOME"]), view.id) == {
        "a": dispatch_task_id(view.id, 0, 1), "b": dispatch_task_id(view.id, 1, 1)}


def test_a_worker_killed_in_a_step_it_took_itself_is_recovered_and_only_that_step_runs_again(
        stack, app, stack_env):
    start(stack, {"SAS_FAULTS": "agent.before_call.b=kill@once"})
    handle = app.submit("line", {}, business_key="line-killed")
    view = handle.wait(30)
    assert view.process_state == "processed"
    b = view.step("b")
    # the killed attempt had no message to redeliver: the Supervisor found it at its complete-by,
    # sent attempt 2 through the broker (no failure counted: nobody answered), and c followed it
    assert (b.attempt, b.failure_count) == (2, 0)
    assert [view.step(n).attempt for n in "ac"] == [1, 1]
    retry = dispatch_task_id(view.id, 1, 2)
    assert tasks_of(Path(stack_env["SAS_HOME"]), view.id) == {"a": dispatch_task_id(view.id, 0, 1), "b": retry,
                                                              "c": retry}
    retried = [e for e in view.events if e.position == 1 and e.from_state == "running" and e.to_state == "pending"]
    assert len(retried) == 1


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)  # which hands a dead consumer's messages on at once
def test_the_first_step_s_message_delivered_again_after_its_worker_died_later_in_the_sequence_is_not_run(
        stack, app, stack_env):
    home = Path(stack_env["SAS_HOME"])
    stack.worker("scheduler", "sas.scheduler,sas.supervisor", env=APP, wait=False)
    stack.worker("old", "sas.agent.work", 1, env={**APP, "SAS_FAULTS": "agent.before_call.b=sleep:60@once"},
                 wait=False)
    stack.beat(env=APP, wait=False)
    stack.wait_ready()
    handle = app.submit("line_long_first", {}, business_key="line-redelivered")
    # a completed; b taken by the same worker and stalled there, a's message not yet acknowledged
    wait_for(lambda: any(c["key"] == f"{handle.id}:a" for c in calls(home)), 30, "step a to be called")
    wait_for(lambda: handle.status().step("b").state == "running", 10, "step b to start")
    stack.worker("new", "sas.agent.work", 1, env=APP)
    stack.signal("old", signal.SIGKILL)  # the whole worker: RabbitMQ delivers a's message again, to the new one
    view = handle.wait(60)
    assert view.process_state == "processed"
    assert [c["key"] for c in calls(home)] == [f"{handle.id}:{n}" for n in "abc"]  # a not called twice
    assert [(n, view.step(n).attempt) for n in "abc"] == [("a", 1), ("b", 2), ("c", 1)]


def test_a_worker_sent_sigterm_finishes_its_step_and_leaves_the_next_to_the_workers_that_stay(
        stack, app, stack_env):
    home = Path(stack_env["SAS_HOME"])
    stack.worker("scheduler", "sas.scheduler,sas.supervisor", env=APP, wait=False)
    stack.worker("old", "sas.agent.work", 1, env=APP, wait=False)
    stack.beat(env=APP, wait=False)
    stack.wait_ready()
    # each step takes a second: b (3 s) would fit in a's message (60 s), were its worker staying
    handle = app.submit("line_long_first", {"sleep": 1}, business_key="line-drained")
    wait_for(lambda: any(c["key"] == f"{handle.id}:a" for c in calls(home)), 30, "step a to be called")
    stack.signal("old", signal.SIGTERM, group=False)  # the kubelet's SIGTERM: to the main process only
    stack.worker("new", "sas.agent.work", 1, env=APP)
    view = handle.wait(30)
    assert view.process_state == "processed"
    assert [(n, view.step(n).attempt) for n in "abc"] == [("a", 1), ("b", 1), ("c", 1)]  # nothing retried
    ran = {c["key"].split(":")[1]: c for c in calls(home) if c["key"].startswith(f"{handle.id}:")}
    # a finished where it ran; b went through the broker, to the worker that stays
    assert [ran[n]["task"] for n in "ab"] == [dispatch_task_id(handle.id, p, 1) for p in (0, 1)]
    assert ran["a"]["pid"] != ran["b"]["pid"]
    wait_for(lambda: stack.procs["old"].poll() is not None, 10, "the draining worker to exit")
    assert stack.procs["old"].returncode == 0
