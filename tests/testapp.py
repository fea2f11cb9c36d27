"""Test workflows whose agents do what the payload tells them, so a test states its fault plainly.

``payload["script"][step]`` is a list of outcomes, one per delivery of that step to the agent:
``"ok"`` (reply with a result), ``"permanent"`` (non-transient fault), ``"transient"`` (raise a
transient fault; the agent retries it), ``"hang"`` (stop silently, as past complete-by),
``"deferred"`` (the agent's breaker is open: it defers the step for 0.05 s), ``"not_yet"`` (a
polling step's job is not done: ask again in 30 s). Once the
list is used up the last outcome repeats; with no script a step just succeeds. An undo is scripted
under its own name, ``"undo:<step>"``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sas_app import (
    AgentCall,
    ChildRun,
    NotYet,
    PermanentError,
    Poll,
    SasApp,
    Sleep,
    Step,
    StepExpired,
    TransientError,
    WaitFor,
)
from sas_app.agents.breaker import BreakerOpen

#: every call an agent received, per idempotency key: (attempt, outcome)
CALLS: dict[str, list[tuple[int, str]]] = defaultdict(list)


def scripted(call: AgentCall) -> dict[str, Any]:
    script = (call.payload.get("script") or {}).get(call.step) or ["ok"]
    seen = CALLS[call.idempotency_key]
    outcome = script[min(len(seen), len(script) - 1)]
    seen.append((call.attempt, outcome))
    if outcome == "permanent":
        raise PermanentError(f"{call.step} refused")
    if outcome == "transient":
        raise TransientError(f"{call.step} busy")
    if outcome == "hang":
        raise StepExpired(call.step)
    if outcome == "not_yet":
        raise NotYet(after=30, detail=f"poll {call.poll}")
    if outcome == "deferred":
        raise BreakerOpen("svc", 0.05)
    if call.index is not None:
        return {"step": call.step, "item": call.item, "index": call.index}
    return {"step": call.step, "attempt": call.attempt, "key": call.idempotency_key,
            "items": call.payload.get("items_from_result")}  # what ``fanout_result`` fans out over


def install_test_workflows(sas: SasApp, timeout: float = 0.3, max_failures: int = 3) -> None:
    """``three``: three steps, nothing to undo. ``saga``: the same, each step with an undo.
    ``diamond``: ``left`` and ``right`` side by side, ``join`` after both, then ``last``.
    ``fanout``: ``prepare``, then ``ship`` once per element of the payload's ``items`` (two at a
    time), then ``confirm``; every step but ``confirm`` with an undo. ``parent``: ``before``, then
    ``spawn`` (a child run of ``kid``: one step ``k1``), then ``after``. ``claim``: ``file`` (with
    an undo), ``manager`` waiting up to two days for the event ``approval``, then ``pay``.
    ``poller``: ``start`` (with an undo), ``check`` polling every 30 s for at most 10 minutes,
    then ``last``."""
    svc = sas.agent("svc", retry_initial=0.01, retry_max=0.02)
    svc.action(scripted, name="work")
    svc.undo(scripted, name="undo")
    sas.workflow(
        "saga",
        [
            Step(name, "svc.work", timeout=timeout, max_failures=max_failures, compensate="svc.undo")
            for name in ("first", "second", "third")
        ],
    )
    sas.workflow(
        "diamond",
        [
            Step("left", "svc.work", timeout=timeout, max_failures=max_failures, compensate="svc.undo"),
            Step("right", "svc.work", timeout=timeout, max_failures=max_failures, compensate="svc.undo", after=[]),
            Step("join", "svc.work", timeout=timeout, max_failures=max_failures, compensate="svc.undo",
                 after=["left", "right"]),
            Step("last", "svc.work", timeout=timeout, max_failures=max_failures),
        ],
    )
    sas.workflow(
        "fanout",
        [
            Step("prepare", "svc.work", timeout=timeout, max_failures=max_failures, compensate="svc.undo"),
            Step("ship", "svc.work", timeout=timeout, max_failures=max_failures, compensate="svc.undo",
                 for_each="items", max_parallel=2),
            Step("confirm", "svc.work", timeout=timeout, max_failures=max_failures),
        ],
    )
    sas.workflow(
        "fanout_result",
        [
            Step("prepare", "svc.work", timeout=timeout, max_failures=max_failures),
            Step("ship", "svc.work", timeout=timeout, max_failures=max_failures, for_each="prepare.items",
                 max_parallel=10),
        ],
    )
    # a child run: "spawn" starts a run of "kid" (with the parent's payload) and waits for it
    sas.workflow("kid", [Step("k1", "svc.work", timeout=timeout, max_failures=max_failures, compensate="svc.undo")])
    sas.workflow(
        "parent",
        [
            Step("before", "svc.work", timeout=timeout, max_failures=max_failures, compensate="svc.undo"),
            ChildRun("spawn", "kid"),
            Step("after", "svc.work", timeout=timeout, max_failures=max_failures),
        ],
    )
    # durable sleeps: a fixed one, and one until a time the payload names
    sas.workflow("nap", [Step("first", "svc.work", timeout=timeout, max_failures=max_failures),
                         Sleep("cool_off", seconds=3 * 86400),
                         Step("last", "svc.work", timeout=timeout, max_failures=max_failures)])
    sas.workflow("claim", [Step("file", "svc.work", timeout=timeout, max_failures=max_failures, compensate="svc.undo"),
                           WaitFor("manager", "approval", timeout=2 * 86400),
                           Step("pay", "svc.work", timeout=timeout, max_failures=max_failures)])
    sas.workflow("poller", [
        Step("start", "svc.work", timeout=timeout, max_failures=max_failures, compensate="svc.undo"),
        Step("check", "svc.work", timeout=timeout, max_failures=max_failures, poll=Poll(every=30, max_wait=600)),
        Step("last", "svc.work", timeout=timeout, max_failures=max_failures),
    ])
    sas.workflow("alarm", [Sleep("until_then", until="wake_at"),
                           Step("last", "svc.work", timeout=timeout, max_failures=max_failures)])
    sas.workflow(
        "three",
        [
            Step("first", "svc.work", timeout=timeout, max_failures=max_failures),
            Step("second", "svc.work", timeout=timeout, max_failures=max_failures),
            Step("third", "svc.work", timeout=timeout, max_failures=max_failures),
        ],
    )
