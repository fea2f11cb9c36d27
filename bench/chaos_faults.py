"""The chaos run's faults: what each kind does to the run's processes and servers, and when each
fires. :class:`Faults` is the part of :class:`bench.chaos.Chaos` that injects them; the run's
fleet, servers and plans are the Chaos's own."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.alert_quality import Outage, ready_times
from bench.chaos_operators import KINDS as OPERATOR_KINDS
from bench.chaos_operators import Operators
from harness.proxy import Proxy
from harness.rabbitmq_node import RabbitNode
from harness.servers import Servers
from sas_app.testing.processes import Processes, Stopped

#: what the schedule can do, each at least ``--each`` times ("poison" submits a poison order; the
#: operators' are :mod:`bench.chaos_operators`)
KINDS = ("kill_agent", "kill_scheduler", "kill_supervisor", "restart_broker", "restart_postgres", "zombie",
         "kill_after_call", "warm_shutdown", "empty_broker", "poison", "broker_outage", "refuse_connections",
         "slow_sweeps", "partition_worker", *OPERATOR_KINDS)
#: how long the broker stays down in a broker outage: past every step's complete-by (5 s at most)
OUTAGE_S = 7.0
#: how long PostgreSQL refuses new connections (its connection limit reached) in that fault
REFUSAL_S = 4.0
#: slow sweeps: each stalls this long after committing its recoveries (longer than the 1 s interval,
#: so the next one starts beside it), for this long
SWEEP_STALL_S, SLOW_SWEEPS_FOR_S = 3.0, 10.0
#: how long the first agent worker, which reaches PostgreSQL through a proxy, is cut off from it
PARTITION_S = 5.0
#: how long a zombie stays stopped: past the charge's 3 s complete-by and any step's 5 s
ZOMBIE_S = 8.0
#: an agent worker restarted by a fault whose log never says it is ready again: away this long
WORKER_BACK_S = 30.0

def plan_chaos(each: int, window: float, rng: random.Random) -> list[tuple[float, str]]:
    """When each fault fires, seconds from the start: every kind ``each`` times, spread over the window."""
    events = [(round(rng.uniform(2.0, max(window - 2.0, 3.0)), 2), kind) for kind in KINDS for _ in range(each)]
    return sorted(events)


class Faults(Operators):
    """Injects one fault of a kind at a time (:meth:`inject`), or a whole schedule (:meth:`chaos`)."""

    fleet: Processes
    servers: Servers
    rabbit: RabbitNode | None
    proxy: Proxy | None
    rng: random.Random
    agent_names: list[str]
    fault_homes: int
    background: list[threading.Thread]
    poison_keys: list[str]
    injected: Counter[str]
    timeline: list[dict[str, Any]]
    started_at: float
    #: set by the first Ctrl-C or SIGTERM (:func:`~sas_app.testing.processes.stopped_by_signals`)
    stop_asked: threading.Event

    def submit(self, key: str, payload: dict[str, Any], workflow: str = "order", reply_to: str | None = None) -> None:
        raise NotImplementedError

    def agent_env(self, name: str) -> dict[str, str]:
        """What an agent worker adds to the run's environment: the first reaches PostgreSQL through
        the proxy that a partition cuts."""
        if name != self.agent_names[0] or self.proxy is None:
            return {}
        return {"SAS_DATABASE_URL": self.servers.database_url.replace(f":{self.servers.pg_port}/",
                                                                      f":{self.proxy.port}/")}

    def later(self, delay: float, action: Callable[[], None]) -> None:
        """``action`` in ``delay`` seconds, unless the run has stopped its processes by then."""
        def run() -> None:
            if self.stop_asked.wait(delay):
                return
            try:
                action()
            except Stopped:
                pass  # the run ended first: starting anything now would leave it behind

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.background.append(thread)

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` (in the main thread); ``KeyboardInterrupt`` at once when a stop is asked,
        even if the signal's own ``KeyboardInterrupt`` was lost in a library's callback."""
        if self.stop_asked.wait(max(0.0, seconds)):
            raise KeyboardInterrupt

    def join(self, thread: threading.Thread, timeout: float) -> None:
        """:meth:`threading.Thread.join`, stopping as :meth:`pause` does."""
        deadline = time.monotonic() + timeout
        while thread.is_alive() and time.monotonic() < deadline:
            self.pause(min(0.25, deadline - time.monotonic()))
            thread.join(0)

    def inject(self, kind: str) -> str:
        fleet, servers, rng = self.fleet, self.servers, self.rng
        if kind in OPERATOR_KINDS:
            return self.operate(kind)
        if kind == "kill_agent":
            name = rng.choice(self.agent_names)
            fleet.restart(name)
            return name
        if kind == "kill_scheduler":
            fleet.restart("scheduler")
            return "scheduler"
        if kind == "kill_supervisor":  # the worker whose tasks are the Supervisor, or a beat that starts them
            name = rng.choice(("beat1", "beat2", "supervisor"))
            fleet.kill(name)
            self.later(2.0, lambda: fleet.start(name, wait=False))
            return name
        if kind == "restart_broker" and self.rabbit:
            self.bounce_broker(1.0)
            return "RabbitMQ SIGKILLed, restarted with its durable queues"
        if kind == "restart_broker":
            self.bounce_broker(1.0)
            return "Redis SIGKILLed, restarted from its append-only file"
        if kind == "broker_outage":  # the faults after it wait: no restart lands inside the outage
            broker = self.bounce_broker(OUTAGE_S)
            return f"{broker} down {OUTAGE_S:.0f}s, past every step's complete-by"
        if kind == "partition_worker":
            assert self.proxy is not None
            dropped = self.proxy.cut(PARTITION_S)
            return (f"{self.agent_names[0]} cut off from PostgreSQL for {PARTITION_S:g}s ({dropped} connections "
                    "dropped); the others carry on")
        if kind == "slow_sweeps":
            fleet.restart("supervisor", env={"SAS_FAULTS": f"supervisor.after_commit=sleep:{SWEEP_STALL_S:g}"})
            self.later(SLOW_SWEEPS_FOR_S, lambda: fleet.restart("supervisor", env={}))
            return f"each sweep stalls {SWEEP_STALL_S:g}s after its commit for {SLOW_SWEEPS_FOR_S:g}s: sweeps overlap"
        if kind == "refuse_connections":
            dropped = servers.refuse_connections(REFUSAL_S)
            return f"PostgreSQL refused every new connection for {REFUSAL_S:.0f}s, {dropped} dropped"
        if kind == "restart_postgres":
            servers.stop_postgres("immediate")
            time.sleep(1.0)
            servers.start_postgres()
            return "immediate stop, crash recovery"
        if kind == "empty_broker" and self.rabbit:
            return f"RabbitMQ: every queue purged ({self.rabbit.purge()} ready messages)"
        if kind == "empty_broker":
            servers.flushall()
            return "Redis FLUSHALL: every queue, unacked message and binding gone"
        if kind == "zombie":
            name = rng.choice(self.agent_names)
            fleet.signal(name, signal.SIGSTOP)
            self.later(ZOMBIE_S, lambda: fleet.signal(name, signal.SIGCONT))
            return f"{name} stopped {ZOMBIE_S:.0f}s"
        if kind == "kill_after_call":
            name = rng.choice(self.agent_names)
            self.fault_homes += 1
            # A fault-point marker of its own, so "@once" fires once in this worker's life.
            fleet.restart(name, env={**self.agent_env(name), "SAS_FAULTS": "agent.after_call=kill@once",
                                     "SAS_HOME": str(self.home / f"fault-{self.fault_homes}")})
            return name
        if kind == "warm_shutdown":
            name = rng.choice(self.agent_names)
            fleet.signal(name, signal.SIGTERM, group=False)

            process = fleet.procs[name]

            def restart_when_gone() -> None:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    fleet.kill(name)
                fleet.start(name, env=self.agent_env(name), wait=False)

            self.later(0.0, restart_when_gone)
            return name
        if kind == "poison":
            key = f"poison-{len(self.poison_keys)}"
            self.poison_keys.append(key)
            self.submit(key, {"amount": 1.0, "faults": {"charge": "poison"}})
            return key
        raise ValueError(kind)

    def outages(self) -> list[Outage]:
        """The timeline's outages, on the wall clock, for the at-risk alerts' judge: what they held
        up was no backlog to foresee. The broker down or restarted, PostgreSQL restarted or refusing
        new connections: everyone's. An agent worker frozen, cut off from PostgreSQL, or killed or
        shut down (until its log says it is ready again): its own, one of the queue's workers."""
        found = []
        share = 1.0 / len(self.agent_names)
        ready = {name: ready_times(self.fleet.log(name)) for name in self.agent_names}

        def back(name: str, since: float) -> float:
            return next((at for at in ready[name] if at > since), since + WORKER_BACK_S)

        for e in self.timeline:
            start, kind = self.started_at + e["at"], e["kind"]
            name = e["detail"].split()[0]
            if not e["injected"]:
                continue
            if kind in ("broker_outage", "restart_broker", "restart_postgres", "refuse_connections"):
                found.append(Outage(start, start + e["took_s"]))
            elif kind == "zombie":
                found.append(Outage(start, start + ZOMBIE_S, worker=name, share=share))
            elif kind == "partition_worker":
                found.append(Outage(start, start + PARTITION_S, worker=self.agent_names[0], share=share))
            elif kind in ("kill_agent", "kill_after_call", "warm_shutdown"):
                found.append(Outage(start, back(name, start), worker=name, share=share, settle=0.0))
        return found

    def bounce_broker(self, down: float) -> str:
        """SIGKILL the broker, and start it again ``down`` seconds later; which broker it was."""
        if self.rabbit:
            self.rabbit.kill()
            time.sleep(down)
            self.rabbit.start()
            return "RabbitMQ"
        self.servers.kill_redis()
        time.sleep(down)
        self.servers.start_redis()
        return "Redis"

    def chaos(self, schedule: list[tuple[float, str]], started: float) -> None:
        for at, kind in schedule:
            if self.stop_asked.wait(max(0.0, started + at - time.monotonic())):
                return  # the run is stopping: no fault may start a process its stopping would miss
            t0 = time.monotonic()
            try:
                detail = self.inject(kind)
                ok = True
            except Exception as exc:  # a fault that could not be injected is reported, not hidden
                detail, ok = f"{type(exc).__name__}: {exc}", False
            self.injected[kind] += ok
            self.timeline.append({"at": round(t0 - started, 2), "kind": kind, "detail": detail, "injected": ok,
                                  "took_s": round(time.monotonic() - t0, 2)})
