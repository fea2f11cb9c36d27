"""Workflows with parallel steps, fan-outs and joins, for tests on real worker processes
(``SAS_APP=tests.integration.graph_app:sas``). Every agent call is appended to
``$SAS_HOME/calls.jsonl`` (key, attempt, pid) so a test counts calls across processes.

``payload["sleep"]``: seconds each call sleeps. ``payload["fail"]``: the items whose branch fails
for good (``payload["fail_steps"]``: the steps). ``payload["barrier"]``: how many branches must
reach the barrier before any returns, so they finish at the same moment on different workers.
``payload["hang_first"]``: the item whose first attempt hangs (long enough for a test to kill its
worker). With ``GRAPH_APP_SCHEDULE`` set (a cron expression), the schedule ``ticking`` starts a
run of ``ticked`` at each tick. ``payload["overrun"]``: ``{step: n}``, its first n attempts outlast their complete-by.
``line``: three steps of one agent in a row; each call records the Celery task it ran under.
``fixable``'s ``charge`` fails for good until ``$SAS_HOME/fixed`` exists (the fix, deployed).
``render`` polls a job kept in ``$SAS_HOME/jobs``: it is done at the call after ``payload["polls"]``
"not yet" answers, each asking again in ``payload["every"]`` seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from celery import current_task

from sas_app import (
    AgentCall,
    ChildRun,
    Escalate,
    NotYet,
    PermanentError,
    Poll,
    SasApp,
    Sleep,
    Step,
    UndoCall,
    WaitFor,
    Workflow,
)


def home() -> Path:
    return Path(os.environ.get("SAS_HOME", ".sas"))


def record(call: AgentCall, what: str) -> None:
    task = current_task.request.id if current_task else None  # the Celery task (message) it runs under
    line = json.dumps({"key": call.idempotency_key, "attempt": call.attempt, "pid": os.getpid(), "what": what,
                       "poll": call.poll, "task": task})
    with (home() / "calls.jsonl").open("a") as out:
        out.write(line + "\n")


def calls(folder: Path) -> list[dict[str, Any]]:
    path = folder / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def step(call: AgentCall) -> dict[str, Any]:
    record(call, "do")
    if call.item in (call.payload.get("fail") or []) or call.step in (call.payload.get("fail_steps") or []):
        raise PermanentError(f"{call.step} refused")
    barrier = call.payload.get("barrier")
    if barrier and call.index is not None:
        folder = home() / "barrier" / call.run_id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / str(call.index)).touch()
        deadline = time.monotonic() + 10
        while len(list(folder.iterdir())) < barrier and time.monotonic() < deadline:
            time.sleep(0.002)
    if call.item is not None and call.item == call.payload.get("hang_first") and call.attempt == 1:
        time.sleep(60)
    if call.attempt <= (call.payload.get("overrun") or {}).get(call.step, 0):
        time.sleep(call.budget + 0.3)
    time.sleep(float(call.payload.get("sleep", 0)))
    return {"step": call.step, "item": call.item, "pid": os.getpid()}


def undo(call: UndoCall) -> dict[str, Any]:
    record(call, "undo")
    return {"undid": {"step": call.undoes.step, "idempotency_key": call.undoes.idempotency_key}}


async def fetch(call: AgentCall) -> dict[str, Any]:
    """An I/O-bound call written as a coroutine: waits ``payload["sleep"]`` seconds on the event
    loop, and says which thread and loop ran it, and when."""
    started = time.time()
    await asyncio.sleep(float(call.payload.get("sleep", 0)))
    return {"thread": threading.get_ident(), "loop": id(asyncio.get_running_loop()), "pid": os.getpid(),
            "started": started, "ended": time.time()}


def render(call: AgentCall) -> dict[str, Any]:
    """Starts a job on the first call (its id: the idempotency key), checks it on the others."""
    record(call, "render")
    job = home() / "jobs" / call.idempotency_key
    job.parent.mkdir(parents=True, exist_ok=True)
    checks = int(job.read_text()) + 1 if job.exists() else 0
    job.write_text(str(checks))
    if checks < int(call.payload.get("polls", 0)):
        raise NotYet(after=float(call.payload.get("every", 1)), detail=f"check {checks}")
    return {"rendered": call.idempotency_key, "checks": checks}


def charge(call: AgentCall) -> dict[str, Any]:
    record(call, "charge")
    if not (home() / "fixed").exists():
        raise PermanentError("charge: the bug")
    return {"charged": call.idempotency_key}


def install(sas: SasApp) -> None:
    work = sas.agent("work")
    work.action(step, name="step")
    work.undo(undo, name="undo")
    work.action(fetch, name="fetch")
    work.action(render, name="render")
    work.action(charge, name="charge")
    sas.register(Workflow("fixable", [Step("note", "work.step", timeout=10), Step("charge", "work.charge", timeout=10),
                                      Step("ship", "work.step", timeout=10)]))
    sas.register(Workflow("rendering", [
        Step("first", "work.step", timeout=10, compensate="work.undo"),
        Step("render", "work.render", timeout=5, poll=Poll(every=1, max_wait=120)),
    ]))
    sas.register(Workflow("rendering_briefly", [
        Step("first", "work.step", timeout=10, compensate="work.undo"),
        Step("render", "work.render", timeout=5, poll=Poll(every=0.5, max_wait=3)),
    ]))
    sas.register(Workflow("fetching", [Step("fetch", "work.fetch", timeout=10)]))
    for workflow in WORKFLOWS:
        sas.register(workflow)
    # a child run, registered before the workflow that starts it
    sas.register(Workflow("kid", [Step("k", "work.step", timeout=10, compensate="work.undo")]))
    sas.register(Workflow("napper", [Step("a", "work.step", timeout=10), Sleep("nap", seconds=2),
                                     Step("b", "work.step", timeout=10)]))
    sas.register(Workflow("approval", [Step("first", "work.step", timeout=10, compensate="work.undo"),
                                       WaitFor("approve", "approval", timeout=2),
                                       Step("last", "work.step", timeout=10)]))
    sas.register(Workflow("per_key", [Step("a", "work.step", timeout=10), Step("b", "work.step", timeout=10)],
                          concurrency_key="key", max_running=1))
    sas.register(Workflow("escalating", [
        Step("first", "work.step", timeout=10, compensate="work.undo"),
        Step("flaky", "work.step", timeout=1, max_failures=1, on_exhausted=Escalate(wait=2, retries=1)),
    ]))
    sas.register(Workflow("ticked", [Step("a", "work.step", timeout=10)]))
    sas.register(Workflow("line", [Step(name, "work.step", timeout=3) for name in ("a", "b", "c")]))
    # ``a``'s message outlives the short steps its worker runs after it
    sas.register(Workflow("line_long_first", [Step("a", "work.step", timeout=60), Step("b", "work.step", timeout=3),
                                              Step("c", "work.step", timeout=3)]))
    # ``b``'s timeout would end after the soft time limit of ``a``'s message
    sas.register(Workflow("line_longer", [Step("a", "work.step", timeout=3), Step("b", "work.step", timeout=6)]))
    cron = os.environ.get("GRAPH_APP_SCHEDULE")  # only the schedule tests' processes start runs on their own
    if cron:
        sas.schedule("ticking", workflow="ticked", cron=cron, overlap="allow", catch_up=60)
    sas.register(Workflow("with_child", [
        Step("first", "work.step", timeout=10, compensate="work.undo"),
        ChildRun("spawn", "kid"),
        Step("last", "work.step", timeout=10),
    ]))


WORKFLOWS = [Workflow("three_at_once", [
    Step("a", "work.step", timeout=10, after=[]),
    Step("b", "work.step", timeout=10, after=[]),
    Step("c", "work.step", timeout=10, after=[]),
    Step("join", "work.step", timeout=10, after=["a", "b", "c"]),
]), Workflow("race", [
    Step("pair", "work.step", timeout=10, for_each="items", max_parallel=2),
    Step("join", "work.step", timeout=10),
]), Workflow("wide", [
    Step("each", "work.step", timeout=30, for_each="items", max_parallel=10),
    Step("join", "work.step", timeout=10),
]), Workflow("undo_on_failure", [
    Step("first", "work.step", timeout=10, compensate="work.undo"),
    Step("each", "work.step", timeout=10, compensate="work.undo", for_each="items", max_parallel=3),
    Step("join", "work.step", timeout=10, compensate="work.undo"),
]), Workflow("long_branch", [
    Step("each", "work.step", timeout=4, for_each="items", max_parallel=2),
    Step("join", "work.step", timeout=10),
]), Workflow("versioned", [
    Step("a", "work.step", timeout=10),
    Step("renamed", "work.step", timeout=10),
])]

sas = SasApp()
celery = sas.celery
install(sas)
