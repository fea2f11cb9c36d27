"""The checks a workflow passes when it is registered: names, bounds, the step graph (no unknown
step, no cycle, a fan-out, sleep or condition reading only results it waits for), child runs,
sleeps, waits, escalations, polling, the concurrency key and the deadline. Each mistake is a
:class:`~sas_app.errors.WorkflowDefinitionError` naming it, raised before anything is registered."""

from __future__ import annotations

import math
from collections.abc import Iterable
from graphlib import CycleError, TopologicalSorter
from typing import Any

from sas_app.definitions.actions import UndoAction
from sas_app.definitions.conditions import Guard
from sas_app.definitions.inputs import is_model
from sas_app.definitions.steps import Escalate, Poll, StepSpec, action_name, seconds_of
from sas_app.definitions.workflow import NAME, ON_TIMEOUT, Workflow
from sas_app.errors import WorkflowDefinitionError


def check_workflow(
    workflow: Workflow, known_actions: Iterable[str], *, undos: Iterable[str], visibility_timeout: float,
    consumer_timeout: float | None = None, clock_skew: float = 0.0, known_workflows: Iterable[str] = (),
    max_sleep: float = 30 * 86400, max_deadline: float = 90 * 86400,
) -> None:
    """Raise :class:`WorkflowDefinitionError` naming the first mistake in ``workflow``
    (``known_actions``: the registered actions and undos by ``<agent>.<name>``, ``undos`` the
    undos among them; ``known_workflows``: those registered before it, which its child steps may
    start). With an
    AMQP broker ``consumer_timeout`` is its consumer timeout, else Redis's ``visibility_timeout``
    bounds a step's."""
    known, undo_names = set(known_actions), set(undos)
    where = f"workflow {workflow.name!r}"
    if not isinstance(workflow.name, str) or not NAME.match(workflow.name):
        raise WorkflowDefinitionError(
            f"workflow name {workflow.name!r} must start with a letter and use only letters, "
            "digits, '_' and '-' (at most 100)"
        )
    if not workflow.specs:
        raise WorkflowDefinitionError(f"{where} has no steps")
    seen: set[str] = set()
    for s in workflow.specs:
        if not isinstance(s.name, str) or not NAME.match(s.name):
            raise WorkflowDefinitionError(f"{where}: step name {s.name!r} is not a valid name")
        if s.name in seen:
            raise WorkflowDefinitionError(f"{where}: duplicate step name {s.name!r}")
        seen.add(s.name)
        _check_guard(where, s)
        if s.sleep is not None or s.sleep_until is not None:
            _check_sleep(where, s, max_sleep)
            continue
        if s.event is not None:
            _check_wait(where, s, max_sleep)
            continue
        _check_child(where, s, set(known_workflows))
        for label, ref in (("action", s.action), ("compensate", s.compensate)):
            if ref is None:
                continue
            name = action_name(ref)
            if name not in known:
                raise WorkflowDefinitionError(
                    f"{where}, step {s.name!r}: unknown agent action {name!r} for {label}; "
                    f"registered: {sorted(known) or 'none'}"
                )
            is_undo = isinstance(ref, UndoAction) or (isinstance(ref, str) and name in undo_names)
            if label == "action" and is_undo:
                raise WorkflowDefinitionError(
                    f"{where}, step {s.name!r}: its action {name!r} is an undo (@agent.undo); a step's action "
                    "is an @agent.action, and the undo goes in compensate=")
            if label == "compensate" and not is_undo:
                # an action called as an undo would apply its effect again instead of undoing it
                raise WorkflowDefinitionError(
                    f"{where}, step {s.name!r}: its compensate {name!r} is an action (@agent.action), which "
                    "would apply its effect a second time; declare what undoes it with @agent.undo")
        if not _is_number(s.timeout) or s.timeout <= 0:
            raise WorkflowDefinitionError(
                f"{where}, step {s.name!r}: timeout must be a positive number of seconds, got {s.timeout!r}"
            )
        if consumer_timeout is not None:
            _check_consumer_timeout(where, s, consumer_timeout, clock_skew)
        elif s.timeout >= visibility_timeout:
            raise WorkflowDefinitionError(
                f"{where}, step {s.name!r}: timeout {s.timeout}s is not below the broker's "
                f"visibility timeout ({visibility_timeout}s); raise SAS_VISIBILITY_TIMEOUT or the "
                "message would be delivered twice while the agent still works on it"
            )
        if not isinstance(s.max_failures, int) or isinstance(s.max_failures, bool) or s.max_failures < 1:
            raise WorkflowDefinitionError(
                f"{where}, step {s.name!r}: max_failures must be an integer >= 1, got {s.max_failures!r}"
            )
        _check_fan_out(where, s)
        _check_escalation(where, s, max_sleep)
        _check_poll(where, s, max_sleep)
    _check_graph(where, workflow)
    deadline = workflow.deadline_seconds
    if deadline is not None and (not _is_number(deadline) or not 0 < deadline <= max_deadline):
        raise WorkflowDefinitionError(f"{where}: deadline must be more than 0 and at most {max_deadline:g} seconds "
                                      f"(SAS_MAX_DEADLINE), got {workflow.deadline!r}")
    _check_concurrency(where, workflow)
    if workflow.input is not None and not is_model(workflow.input):
        raise WorkflowDefinitionError(f"{where}: input must be a pydantic model class (a subclass of "
                                      f"pydantic.BaseModel), got {workflow.input!r}")
    events = [s.event for s in workflow.specs if s.event is not None]
    twice = sorted({e for e in events if events.count(e) > 1})
    if twice:
        raise WorkflowDefinitionError(f"{where}: more than one step waits for event {twice[0]!r}; give each wait "
                                      "its own event, so a signal names one wait")
    if workflow.version is not None and (not isinstance(workflow.version, str) or not NAME.match(workflow.version)):
        raise WorkflowDefinitionError(f"{where}: version {workflow.version!r} must be a name (letters, digits, "
                                      "'_', '-')")


def _check_guard(where: str, s: StepSpec) -> None:
    """A condition names a payload key or ``<step>.<key>`` (the step is checked with the graph),
    or is a function."""
    guard = s.guard
    if guard is None:
        return
    if not isinstance(guard, Guard):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: guard must be a Guard, got {guard!r}")
    if guard.fn is None and (not isinstance(guard.path, str)
                             or not all(NAME.match(part) for part in guard.path.split(".", 1))):
        raise WorkflowDefinitionError(
            f"{where}, step {s.name!r}: a condition names a payload key ('express'), an earlier step's result "
            f"key (quote.output('express')) or is a function of a StepContext, got {guard.path!r}")


def _check_consumer_timeout(where: str, s: StepSpec, consumer_timeout: float, clock_skew: float) -> None:
    """RabbitMQ closes the channel of a consumer that holds a message unacknowledged past its
    consumer timeout; an agent acknowledges a step's message once the step has ended."""
    if s.timeout + clock_skew >= consumer_timeout:
        raise WorkflowDefinitionError(
            f"{where}, step {s.name!r}: timeout {s.timeout:g}s plus the clock-skew margin {clock_skew:g}s "
            f"({s.timeout + clock_skew:g}s) is not below the broker's consumer timeout ({consumer_timeout:g}s): "
            "RabbitMQ would close the channel of a message still in work; shorten the step's timeout, or raise "
            "consumer_timeout in rabbitmq.conf and SAS_BROKER_CONSUMER_TIMEOUT with it"
        )


def _check_sleep(where: str, s: StepSpec, max_sleep: float) -> None:
    if (s.action is not None or s.child is not None or s.for_each is not None or s.compensate is not None
            or s.event is not None or s.on_exhausted is not None):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a sleep runs no action, child, fan-out, undo "
                                      "or escalation")
    if (s.sleep is None) == (s.sleep_until is None):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a sleep needs seconds or until=, exactly one")
    if s.sleep is not None and (not _is_number(s.sleep) or not 0 < s.sleep <= max_sleep):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: sleep must be more than 0 and at most "
                                      f"{max_sleep:g} seconds (SAS_MAX_SLEEP), got {s.sleep!r}")
    if s.sleep_until is not None and (not isinstance(s.sleep_until, str)
                                      or not all(NAME.match(part) for part in s.sleep_until.split(".", 1))):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: until must name a payload key ('wake_at') or "
                                      f"an earlier step's result key ('quote.valid_until'), got {s.sleep_until!r}")


def _check_wait(where: str, s: StepSpec, max_wait: float) -> None:
    if (s.action is not None or s.child is not None or s.for_each is not None or s.compensate is not None
            or s.on_exhausted is not None):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a wait runs no action, child, fan-out, undo or "
                                      "escalation (its on_timeout says what its timeout does)")
    if not isinstance(s.event, str) or not NAME.match(s.event):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: event {s.event!r} must be a name (letters, "
                                      "digits, '_', '-')")
    if not _is_number(s.timeout) or not 0 < s.timeout <= max_wait:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a wait's timeout must be more than 0 and at most "
                                      f"{max_wait:g} seconds (SAS_MAX_SLEEP), got {s.timeout!r}")
    if s.on_timeout not in ON_TIMEOUT:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: on_timeout must be one of {', '.join(ON_TIMEOUT)}; "
                                      f"got {s.on_timeout!r}")


def _check_concurrency(where: str, workflow: Workflow) -> None:
    key, most = workflow.concurrency_key, workflow.max_running
    if key is not None and (not isinstance(key, str) or not NAME.match(key)):
        raise WorkflowDefinitionError(f"{where}: concurrency_key must name a payload key, got {key!r}")
    if not isinstance(most, int) or isinstance(most, bool) or most < 1:
        raise WorkflowDefinitionError(f"{where}: max_running must be an integer >= 1, got {most!r}")


def _check_escalation(where: str, s: StepSpec, max_wait: float) -> None:
    e = s.on_exhausted
    if e is None:
        return
    if not isinstance(e, Escalate):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: on_exhausted must be an Escalate(...), got {e!r}")
    if s.child is not None:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a child run is supervised on its own; it has no "
                                      "failure threshold to escalate")
    wait = seconds_of(e.wait)
    if not _is_number(wait) or not 0 < wait <= max_wait:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: Escalate wait must be more than 0 and at most "
                                      f"{max_wait:g} seconds (SAS_MAX_SLEEP), got {e.wait!r}")
    if not isinstance(e.retries, int) or isinstance(e.retries, bool) or not 1 <= e.retries <= s.max_failures:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: Escalate retries must be an integer from 1 to "
                                      f"the step's max_failures ({s.max_failures}), got {e.retries!r}")
    if e.then not in ("compensate", "error"):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: Escalate then must be 'compensate' or 'error', "
                                      f"got {e.then!r}")


def _check_poll(where: str, s: StepSpec, max_wait: float) -> None:
    p = s.poll
    if p is None:
        return
    if not isinstance(p, Poll):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: poll must be a Poll(every, max_wait), got {p!r}")
    if s.for_each is not None:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a fan-out's branches cannot poll yet")
    every, most = seconds_of(p.every), seconds_of(p.max_wait)
    if not _is_number(every) or every <= 0:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: Poll every must be more than 0 seconds, got "
                                      f"{p.every!r}")
    if not _is_number(most) or not every <= most <= max_wait:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: Poll max_wait must be at least every ({every:g} s) "
                                      f"and at most {max_wait:g} seconds (SAS_MAX_SLEEP), got {p.max_wait!r}")


def _check_child(where: str, s: StepSpec, workflows: set[str]) -> None:
    """A step runs an agent action or a child workflow, registered before this one (so a
    workflow never starts itself)."""
    if (s.action is None) == (s.child is None):
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: give an agent action or child=<workflow>, "
                                      "exactly one of them")
    if s.child is None:
        return
    if s.child not in workflows:
        raise WorkflowDefinitionError(
            f"{where}, step {s.name!r}: child workflow {s.child!r} is not registered; register it before "
            f"this one (registered: {sorted(workflows) or 'none'})"
        )
    if s.for_each is not None:
        raise WorkflowDefinitionError(f"{where}, step {s.name!r}: a child run cannot fan out (for_each) yet")


def _check_fan_out(where: str, s: StepSpec) -> None:
    if s.for_each is None:
        return
    if not isinstance(s.for_each, str) or not all(NAME.match(part) for part in s.for_each.split(".", 1)):
        raise WorkflowDefinitionError(
            f"{where}, step {s.name!r}: for_each must name a payload key ('items') or an earlier step's "
            f"result key ('reserve_stock.items'), got {s.for_each!r}"
        )
    if not isinstance(s.max_parallel, int) or isinstance(s.max_parallel, bool) or s.max_parallel < 1:
        raise WorkflowDefinitionError(
            f"{where}, step {s.name!r}: max_parallel must be an integer >= 1, got {s.max_parallel!r}"
        )


def _check_graph(where: str, workflow: Workflow) -> None:
    """Every ``after`` names a step of this workflow, once, and the steps form no cycle; a
    ``for_each`` over an earlier result names a step it (indirectly) waits for."""
    names = [s.name for s in workflow.specs]
    for s in workflow.specs:
        if s.after is None:
            continue
        if isinstance(s.after, str) or not all(isinstance(n, str) for n in s.after):
            raise WorkflowDefinitionError(f"{where}, step {s.name!r}: after must be a list of step names, "
                                          f"got {s.after!r}")
        for name in s.after:
            if name not in names:
                raise WorkflowDefinitionError(f"{where}, step {s.name!r}: after names {name!r}, which is not a "
                                              f"step of this workflow; its steps: {names}")
            if name == s.name:
                raise WorkflowDefinitionError(f"{where}, step {s.name!r} waits for itself")
        if len(set(s.after)) != len(s.after):
            raise WorkflowDefinitionError(f"{where}, step {s.name!r}: after names a step twice: {list(s.after)}")
    waits = workflow.waits_for
    graph = {names[i]: {names[j] for j in deps} for i, deps in enumerate(waits)}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        cycle = " -> ".join(exc.args[1])
        raise WorkflowDefinitionError(f"{where}: the steps wait for each other in a cycle: {cycle}") from None
    for position, s in enumerate(workflow.specs):
        before = {names[i] for i in workflow.upstream(position)}
        for read in (s.for_each, s.sleep_until, None if s.guard is None else s.guard.path):
            source = (read or "").split(".", 1)
            if len(source) == 2 and source[0] not in before:
                raise WorkflowDefinitionError(
                    f"{where}, step {s.name!r}: {read!r} reads the result of {source[0]!r}, which it does not "
                    "wait for (add it to after=)" if source[0] in names else
                    f"{where}, step {s.name!r}: {read!r} names no step of this workflow; its steps: {names}"
                )


def _is_number(value: Any) -> bool:
    """A finite int or float (NaN compares false with everything, so no bound would refuse it)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
