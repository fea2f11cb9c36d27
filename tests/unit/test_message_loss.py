"""Every message sas_app publishes after a commit, lost once: the run still ends as it would have.

Each kind of publish (:class:`sas_app.messaging.publishes.Publish`) has a story here that makes sas_app send
it; the story runs twice, once as is and once with the first message of that kind dropped by the
broker (the pump takes it and runs nothing), and both runs must end the same — their state and
every step's. A kind added to ``Publish`` without a story here fails
:func:`test_every_kind_of_publish_has_a_loss_story`. On SQLite here (the clock moved, not waited
for) and, as integration tests, on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sas_app import Escalate, SasApp, Sleep, Step, WaitFor, Workflow
from sas_app.agents.worker_lost import report_lost
from sas_app.messaging.publishes import Publish
from sas_app.testing import Environment
from tests.support import Pump, pass_time

pytestmark = pytest.mark.both_stores

SCHEDULER = ["sas.scheduler"]
AGENT = ["sas.agent.svc"]
REPLY_TO = "loss.replies"

#: a story: given the app, its pump and a business key, it does what makes sas_app publish the kind
#: it is filed under, and returns the runs whose end is compared
Story = Callable[[SasApp, Pump, str], list[str]]
STORIES: dict[Publish, list[Story]] = {}


def story(*kinds: Publish) -> Callable[[Story], Story]:
    def file(fn: Story) -> Story:
        for kind in kinds:
            STORIES.setdefault(kind, []).append(fn)
        return fn
    return file


@story(Publish.SUBMITTED, Publish.DISPATCH, Publish.STEP_DONE)
def a_three_step_run(sas: SasApp, pump: Pump, key: str) -> list[str]:
    return [sas.submit("three", {}, business_key=key).id]


@story(Publish.NOTIFIED)
def a_run_that_tells_its_submitter(sas: SasApp, pump: Pump, key: str) -> list[str]:
    return [sas.submit("three", {}, business_key=key, reply_to=REPLY_TO).id]


@story(Publish.SCHEDULED)
def a_scheduled_run(sas: SasApp, pump: Pump, key: str) -> list[str]:
    sas.schedule(key, workflow="three", cron="* * * * * *")  # every second
    sas.schedules.tick()  # first seen now
    pass_time(sas, sas.store.now() + 1.0, "the next tick")
    return [run_id for run_id in sas.schedules.tick() if sas.get_run(run_id).run.schedule == key]


@story(Publish.CHILD_STARTED, Publish.CHILD_ENDED)
def a_run_with_a_child(sas: SasApp, pump: Pump, key: str) -> list[str]:
    return [sas.submit("parent", {}, business_key=key).id]


@story(Publish.CHILD_CANCELLED)
def a_parent_cancelled_while_its_child_runs(sas: SasApp, pump: Pump, key: str) -> list[str]:
    parent = sas.submit("parent", {}, business_key=key)
    pump.run(SCHEDULER)
    pump.run(AGENT)  # "before"
    pump.run(SCHEDULER)  # "spawn" starts the child
    pump.run(SCHEDULER)  # the child's k1 is dispatched
    [child] = sas.store.children(parent.id)
    sas.cancel(parent.id, by="ops")
    return [parent.id, child.id]


@story(Publish.SLOT_FREED)
def two_runs_of_one_key(sas: SasApp, pump: Pump, key: str) -> list[str]:
    first = sas.submit("one_per_key", {"customer": key}, business_key=f"{key}-1")
    sas.test_clock.advance(0.001)
    second = sas.submit("one_per_key", {"customer": key}, business_key=f"{key}-2")
    return [first.id, second.id]


@story(Publish.BACKOFF)
def a_step_whose_worker_died(sas: SasApp, pump: Pump, key: str) -> list[str]:
    handle = sas.submit("three", {}, business_key=key)
    pump.run(SCHEDULER)
    [message] = pump.take("sas.agent.svc")  # the worker process running it died
    assert report_lost(sas.celery, message.kwargs, "worker exited")
    return [handle.id]


@story(Publish.STEP_LOST)
def a_lost_worker_reported(sas: SasApp, pump: Pump, key: str) -> list[str]:
    return a_step_whose_worker_died(sas, pump, key)


@story(Publish.RETRY)
def a_step_that_passes_its_complete_by(sas: SasApp, pump: Pump, key: str) -> list[str]:
    return [sas.submit("three", {"script": {"second": ["hang", "ok"]}}, business_key=key).id]


@story(Publish.REQUEUED)
def a_submit_the_broker_lost(sas: SasApp, pump: Pump, key: str) -> list[str]:
    handle = sas.submit("three", {}, business_key=key)
    pump.take("sas.scheduler")  # lost: the Supervisor asks again
    return [handle.id]


@story(Publish.REQUEUED)
def a_sleep_that_wakes(sas: SasApp, pump: Pump, key: str) -> list[str]:
    """The sweep asks the Scheduler to wake it once its time has come."""
    return [sas.submit("short_nap", {}, business_key=key).id]


@story(Publish.REQUEUED)
def a_step_retried_after_its_escalation_s_wait(sas: SasApp, pump: Pump, key: str) -> list[str]:
    """At its threshold the step waits its escalation's extended period in the store; the sweep
    asks the Scheduler to retry it once that is over."""
    return [sas.submit("escalating", {"script": {"flaky": ["hang", "hang", "ok"]}}, business_key=key).id]


@story(Publish.UNDO)
def a_run_past_its_deadline(sas: SasApp, pump: Pump, key: str) -> list[str]:
    return [sas.submit("due_soon", {}, business_key=key).id]


@story(Publish.UNDO)
def a_step_that_always_passes_its_complete_by(sas: SasApp, pump: Pump, key: str) -> list[str]:
    return [sas.submit("saga", {"script": {"second": ["hang"]}}, business_key=key).id]


@story(Publish.STEP_FAILED, Publish.UNDO_DISPATCH)
def a_step_its_service_refuses(sas: SasApp, pump: Pump, key: str) -> list[str]:
    return [sas.submit("saga", {"script": {"second": ["permanent"]}}, business_key=key).id]


@story(Publish.STEP_DEFERRED)
def a_step_its_breaker_defers(sas: SasApp, pump: Pump, key: str) -> list[str]:
    return [sas.submit("three", {"script": {"second": ["deferred", "ok"]}}, business_key=key).id]


@story(Publish.STEP_NOT_YET)
def a_step_that_polls(sas: SasApp, pump: Pump, key: str) -> list[str]:
    """Lost, its "not yet" leaves the step running: the Supervisor retries it at its complete-by,
    which asks the job again."""
    return [sas.submit("poller", {"script": {"check": ["not_yet", "not_yet", "ok"]}}, business_key=key).id]


@story(Publish.STEP_FAULTS)
def a_step_failing_until_its_complete_by(sas: SasApp, pump: Pump, key: str) -> list[str]:
    """Its agent retries it in-process until complete-by, then stops with no reply but its faults."""
    return [sas.submit("three", {"script": {"second": ["transient"]}}, business_key=key).id]


@story(Publish.RESUMED)
def a_run_paused_then_resumed(sas: SasApp, pump: Pump, key: str) -> list[str]:
    """The issue's case: paused while its first step ran, resumed once that step had completed."""
    handle = sas.submit("three", {}, business_key=key)
    pump.run(SCHEDULER)
    sas.pause(handle.id, by="ops")
    pump.run()
    assert [s.state for s in handle.status().steps] == ["completed", "not_started", "not_started"]
    sas.resume(handle.id, by="ops")
    return [handle.id]


def _in_error(sas: SasApp, pump: Pump, key: str) -> str:
    handle = sas.submit("three", {"script": {"second": ["permanent", "ok"]}}, business_key=key)
    pump.run()
    assert handle.status().process_state == "error"
    return handle.id


@story(Publish.MARKED_DONE)
def a_failed_step_marked_done(sas: SasApp, pump: Pump, key: str) -> list[str]:
    run_id = _in_error(sas, pump, key)
    sas.mark_done(run_id, "second", by="ops", result={"by_hand": True})
    return [run_id]


@story(Publish.RESUBMITTED)
def a_failed_step_resubmitted(sas: SasApp, pump: Pump, key: str) -> list[str]:
    run_id = _in_error(sas, pump, key)
    sas.resubmit(run_id, by="ops", reason="service fixed")
    return [run_id]


def _saga_after_its_first_step(sas: SasApp, pump: Pump, key: str) -> str:
    handle = sas.submit("saga", {}, business_key=key)
    pump.run(SCHEDULER)
    pump.run(AGENT)
    pump.run(SCHEDULER)  # the first step completed, the second dispatched
    return handle.id


@story(Publish.CANCELLED)
def a_run_cancelled_midway(sas: SasApp, pump: Pump, key: str) -> list[str]:
    run_id = _saga_after_its_first_step(sas, pump, key)
    sas.cancel(run_id, by="ops")
    return [run_id]


@story(Publish.COMPENSATE)
def a_run_compensated_midway(sas: SasApp, pump: Pump, key: str) -> list[str]:
    run_id = _saga_after_its_first_step(sas, pump, key)
    sas.compensate(run_id, by="ops")
    return [run_id]


@story(Publish.SIGNALLED)
def a_signal_sent_by_a_process_without_the_workflow(sas: SasApp, pump: Pump, key: str) -> list[str]:
    handle = sas.submit("claim", {}, business_key=key)
    pump.run()
    assert handle.status().step("manager").state == "pending"
    sender = SasApp(sas.settings, clock=sas.test_clock)  # an API process: no workflow registered
    try:
        assert sender.signal(handle.id, "approval", {"approved": True}).status == "kept"
    finally:
        sender.store.dispose()
    return [handle.id]


@pytest.fixture
def sas(sas: SasApp) -> SasApp:
    timeout = sas.workflows["three"].steps[0].timeout
    sas.register(Workflow("one_per_key", [Step("a", "svc.work", timeout=timeout)], concurrency_key="customer"))
    sas.register(Workflow("short_nap", [Sleep("nap", seconds=0.5), Step("a", "svc.work", timeout=timeout)]))
    sas.register(Workflow("escalating", [
        Step("first", "svc.work", timeout=timeout, compensate="svc.undo"),
        Step("flaky", "svc.work", timeout=timeout, max_failures=2, compensate="svc.undo",
             on_exhausted=Escalate(wait=1.0, retries=1, then="compensate"))]))
    sas.register(Workflow("due_soon", [Step("file", "svc.work", timeout=timeout, compensate="svc.undo"),
                                       WaitFor("manager", "approval", timeout=86400)], deadline=1.0))
    return sas


def ended_at(sas: SasApp, run_ids: list[str]) -> float:
    """When the last of the runs changed (the store's clock)."""
    return max(sas.store.get_run(run_id).updated_at for run_id in run_ids)


def ending(sas: SasApp, run_ids: list[str]) -> list[tuple[str, list[tuple[str, str]]]]:
    """How each run ended: its state, and each step's name and state."""
    views = [sas.get_run(run_id) for run_id in run_ids]
    return [(v.process_state, [(s.name, s.state) for s in v.steps]) for v in views]


def test_every_kind_of_publish_has_a_loss_story():
    assert set(Publish) - set(STORIES) == set()


@pytest.mark.parametrize("kind, tell", [(kind, tell) for kind in Publish for tell in STORIES.get(kind, [])],
                         ids=lambda x: str(x) if isinstance(x, Publish) else x.__name__)
def test_a_message_lost_once_leaves_the_run_to_end_as_it_would_have(env: Environment, sas: SasApp, pump: Pump,
                                                                    kind: Publish, tell: Story):
    started = sas.store.now()
    as_is = tell(sas, pump, f"{kind}-as-is")
    for run_id in as_is:
        env.finish(run_id)
    took = {"as is": ended_at(sas, as_is) - started}
    told = {"as is": notifications(pump)}

    if kind is Publish.NOTIFIED:  # the relayer dies after its commit, before it relays
        _relay_lost_once(sas, pump)
    else:
        pump.lose(kind)
    started = sas.store.now()
    lost = tell(sas, pump, f"{kind}-lost")
    for run_id in lost:
        env.finish(run_id)
    took["lost"] = ended_at(sas, lost) - started
    told["lost"] = notifications(pump)

    assert pump.lost == [kind]  # exactly that message, once
    assert ending(sas, lost) == ending(sas, as_is)
    assert told["lost"] == told["as is"]
    # found by the next sweep once its row is due: a complete-by, a back-off and a pick-up time
    # later at most, never at some later time of the run's own (a wait's timeout, a deadline)
    s = sas.settings
    step_timeout = sas.workflows["three"].steps[0].timeout
    assert took["lost"] <= took["as is"] + 2 * (step_timeout + s.retry_backoff_max + s.pickup_timeout), took


def _relay_lost_once(sas: SasApp, pump: Pump) -> None:
    relay, lost = sas.router.relay, []

    def dies_before_relaying(notes: Any) -> None:
        if notes and not lost:
            lost.append(notes)
            pump.lost.append(Publish.NOTIFIED.value)
            return
        relay(notes)

    sas.router.relay = dies_before_relaying  # type: ignore[method-assign]


def notifications(pump: Pump) -> list[str]:
    """The kinds of the notifications waiting on the submitter's queue (taken from it), each once:
    a relay may repeat one, under its id."""
    return sorted({body["id"]: body["kind"] for body in (m.payload for m in pump.drain(REPLY_TO))}.values())
