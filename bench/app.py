"""The benchmark's application: a 3-step workflow whose agent does no remote work (a straight
line, and the same three steps as a graph: two side by side and their join), and the same three
no-op tasks as a plain Celery chain, on the broker and database from the environment; and three
calls to a slow remote service, as async actions, plain actions and a chain (bench.async_agents)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import redis
from celery import Celery
from celery.signals import worker_process_init, worker_ready

from sas_app import AgentCall, SasApp, Step, StepExpired, Workflow

sas = SasApp()
celery = sas.celery
noop = sas.agent("noop", breaker_fail_max=0)


@noop.action
def work(call: AgentCall) -> dict[str, Any]:
    return {}


@noop.action
def silent_once(call: AgentCall) -> dict[str, Any]:
    """Stays silent on a step's first attempt, as an agent that died would: the Supervisor recovers it."""
    if call.attempt == 1:
        raise StepExpired(call.step)
    return {}


# bench.recovery's runs: one step each, whose timeout outlasts dispatching 10,000 of them (the bench
# then sets their complete-by)
sas.register(Workflow("noop1", [Step("one", work, timeout=600)]))
sas.register(Workflow("noop3", [Step(name, work, timeout=30) for name in ("one", "two", "three")]))
# the same three steps as a graph: one and two side by side, three their join
sas.register(Workflow("noop3_graph", [Step("one", work, timeout=30), Step("two", work, timeout=30, after=[]),
                                      Step("three", work, timeout=30, after=["one", "two"])]))
sas.register(Workflow("recover", [Step("once", silent_once, timeout=1)]))

# bench.backpressure's runs: one step whose agent takes a fixed time a call, so that how fast its
# queue drains is known (BENCH_SERVICE_S a call, BENCH_STEP_TIMEOUT a step's complete-by)
steady = sas.agent("steady", breaker_fail_max=0)
SERVICE_S = float(os.environ.get("BENCH_SERVICE_S", "0.05"))


@steady.action
def call(call: AgentCall) -> dict[str, Any]:
    time.sleep(SERVICE_S)
    return {}


sas.register(Workflow("steady1", [Step("one", call, timeout=float(os.environ.get("BENCH_STEP_TIMEOUT", "5")),
                                       max_failures=4)]))

# The baseline a user would hand-roll: the same three no-op tasks as a Celery chain, with the same
# settings (JSON, prefetch 1, late acks), on a Celery app of its own.
chain_app = Celery("chain", set_as_current=False)
chain_app.conf.update(broker_url=os.environ.get("SAS_BROKER_URL", ""), task_serializer="json",
                      accept_content=["json"], task_ignore_result=True, worker_prefetch_multiplier=1,
                      task_acks_late=True, task_default_queue="bench.chain", broker_connection_retry_on_startup=True,
                      # with --task-events, the events sas_app sends by default: a publish's task-sent too
                      task_send_sent_event=os.environ.get("BENCH_TASK_EVENTS") == "true")
_redis: redis.Redis | None = None


@worker_ready.connect
def _ready(sender: Any = None, **_: Any) -> None:
    """A chain worker is consuming: say so in SAS_READY_FILE, as sas_app's workers do."""
    if os.environ.get("SAS_READY_FILE") and getattr(sender, "app", None) is chain_app:
        Path(os.environ["SAS_READY_FILE"]).write_text("ready\n")


@chain_app.task(name="bench.noop", shared=False)
def chain_noop(_: Any = None) -> None:
    return None


@chain_app.task(name="bench.done", shared=False)
def chain_done(_: Any, run: int, key: str) -> None:
    """The chain's last link records when run ``run`` finished."""
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    _redis.hset(key, str(run), time.time())


# bench.async_agents' runs: three steps each calling a remote service that answers in
# BENCH_SLOW_S, as an async action (run on its worker thread's loop, one httpx.AsyncClient a
# thread) or a plain one (one httpx.Client a process), and the same three calls as a Celery chain.
SLOW_URL = os.environ.get("BENCH_SLOW_URL", "")
slow_async = sas.agent("slow_async", breaker_fail_max=0)
slow_sync = sas.agent("slow_sync", breaker_fail_max=0)
_clients = threading.local()


@slow_async.action
async def fetch_async(call: AgentCall) -> dict[str, Any]:
    client = getattr(_clients, "async_client", None)
    if client is None:
        client = _clients.async_client = httpx.AsyncClient(timeout=30)
    response = await client.get(SLOW_URL, headers=call.headers())
    return {"status": response.status_code}


@slow_sync.action
def fetch_sync(call: AgentCall) -> dict[str, Any]:
    client = getattr(_clients, "client", None)
    if client is None:
        client = _clients.client = httpx.Client(timeout=30)
    return {"status": client.get(SLOW_URL, headers=call.headers()).status_code}


sas.register(Workflow("slow3_async", [Step(name, fetch_async, timeout=60) for name in ("one", "two", "three")]))
sas.register(Workflow("slow3_sync", [Step(name, fetch_sync, timeout=60) for name in ("one", "two", "three")]))


@chain_app.task(name="bench.slow", shared=False)
def chain_slow(_: Any = None) -> None:
    client = getattr(_clients, "client", None)
    if client is None:
        client = _clients.client = httpx.Client(timeout=30)
    client.get(SLOW_URL)


# bench.rate_limit's runs: one call each to a service that records when each arrives, through an
# agent whose rate limit (BENCH_RATE_LIMIT) every worker process of the fleet shares.
limited = sas.agent("limited", breaker_fail_max=0, rate_limit=os.environ.get("BENCH_RATE_LIMIT") or None)


_limited_client: httpx.Client | None = None


@worker_process_init.connect
def _open_client(**_: Any) -> None:
    """Each pool process opens its client as it starts, not at its first call: a first call that
    builds it reaches the service late, bunched with the next process's on-time one."""
    global _limited_client
    if os.environ.get("BENCH_LIMITED_URL") and os.environ.get("BENCH_COLD_CLIENTS") != "true":
        _limited_client = httpx.Client(timeout=30)
        _limited_client.get(os.environ["BENCH_LIMITED_URL"] + "warm")


@limited.action
def call_limited(call: AgentCall) -> dict[str, Any]:
    global _limited_client
    if _limited_client is None:
        _limited_client = httpx.Client(timeout=30)
    return {"status": _limited_client.get(os.environ["BENCH_LIMITED_URL"], headers=call.headers()).status_code}


sas.register(Workflow("limited1", [Step("one", call_limited, timeout=30)]))
