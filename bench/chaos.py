"""Chaos: the order example on a real stack while its processes and servers are killed.

Starts its own broker — Redis, or with ``--broker rabbitmq`` a RabbitMQ node — and PostgreSQL
(Debian's server binaries, on free loopback ports, each with a password), the payment and
warehouse services, several agent workers, a Scheduler worker and two beat processes (two
Supervisors). It submits N orders, some with remote faults (transient errors,
hangs past complete-by, latency, a declined card), one or more poison orders whose step kills
the worker running it, and held orders that wait in the store for a manager's review (a signal,
sent while all this goes on) and a cooling-off sleep (:mod:`bench.held_orders`); meanwhile, on a
seeded random schedule, it:

* SIGKILLs and restarts agent workers, the Scheduler worker and a Supervisor (beat);
* restarts the broker (SIGKILL; Redis comes back from its append-only file, RabbitMQ with its
  durable queues) and PostgreSQL (an immediate, crash-like stop) while runs are in flight, keeps
  the broker down past every step's complete-by, has PostgreSQL refuse every new connection for a
  while (its connection limit reached) and drop half of those open, and empties the broker mid-run
  (Redis: FLUSHALL; RabbitMQ: every queue purged);
* makes the Supervisor's sweeps slower than their interval for a while, so that two overlap;
* cuts one agent worker off from PostgreSQL (it connects through a proxy that drops every
  connection and refuses new ones for a while) while the others carry on;
* pauses an agent worker (SIGSTOP) past complete-by and resumes it (a zombie that wakes up late);
* kills an agent after its remote call succeeded but before its reply (fault point);
* asks an agent worker for a warm shutdown (SIGTERM) mid-step and starts it again;
* acts as an operator (:mod:`bench.chaos_operators`): pauses an order and resumes it with the
  resume's message lost (the Scheduler's worker down, the broker emptied), marks a step done,
  cancels an order, resubmits one in error.

Then it heals everything, waits for every run to end, and checks the invariants against the state
store and the services' own ledgers: **no run lost**, **no effect applied twice**, **no run left
unfinished**, no effect left standing on an order that did not complete, no broken promise of
waiting (a signal consumed twice or missed, a sleep woken early), no step attempt ended twice,
nothing left in the outbox, and no password in any log. It prints the figures and writes
``bench/results/chaos-<date>.json``; the exit status is non-zero if any invariant broke. A soak
(``--soak 30m``) is the same run made long, the plans of three seeds one after another, with the
memory of every process and the database connections watched (:mod:`bench.soak`) and judged too;
it writes ``bench/results/soak-seed<N>-<date>.json``. Usage::

    python -m bench.chaos [--orders 500] [--seed 1] [--each 2] [--broker redis|rabbitmq]
    python -m bench.chaos --soak 30m [--seed 1] [--bursts 10]

``--bursts 10`` submits, each minute, the orders due in its first ten seconds at once: the
backlogs a burst makes — and the at-risk alerts' recall on them — in a soak too.
"""

from __future__ import annotations

import argparse
import logging
import os
import pickle
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, select, text
from sqlalchemy.pool import NullPool

from bench import alert_quality
from bench.chaos_faults import KINDS, Faults, plan_chaos
from bench.chaos_operators import ERROR_WITHIN_S
from bench.chaos_report import percentile, print_report, reason, recovery_times
from bench.held_orders import HeldOrders
from bench.soak import Watch, judge, own_pid, parse_duration
from bench.throughput import CHECKOUT_PATH, record
from harness.proxy import Proxy
from harness.rabbitmq_node import RabbitNode
from harness.servers import Servers
from sas_app.states import TERMINAL_RUN_STATES
from sas_app.testing.processes import Processes, Ready, free_port, interrupts_ignored, stopped_by_signals

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
AGENT_QUEUES = "sas.agent.payment,sas.agent.fraud,sas.agent.warehouse,sas.agent.orders"
#: where the orders that ask to be told how they end are told (through the outbox)
REPLIES = "chaos.replies"
#: the at-risk judge's inputs, kept in the home folder with --keep
JUDGED = "at-risk-judged.pickle"
#: seconds between the Supervisor's looks at the agents' queues (SAS_AT_RISK_INTERVAL): a thirtieth
#: of the shortest step timeout (the charge's 3 s)
AT_RISK_INTERVAL = 0.1
#: a soak runs the plans of this many seeds one after another
SOAK_SEEDS = 3
#: a soak's memory and connections: the first and the last this many seconds compared (at most)
SOAK_WINDOW_S = 600.0
#: with --bursts S: each period of this many seconds, the orders due in its first S seconds are
#: submitted at once at its start
BURST_PERIOD_S = 60.0
#: the order example's remote actions, as its payload names them for faults, and their undos
DO_ACTIONS = ("reserve", "charge", "ship")


def arrival(i: int, rate: float, bursts: float = 0.0) -> float:
    """When the ``i``-th order is submitted, seconds from the start: ``rate`` a second, except that
    each :data:`BURST_PERIOD_S` the orders due in its first ``bursts`` seconds come all at once at
    its start (the same orders in the same time, some of them in a burst)."""
    due = i / rate
    into = due % BURST_PERIOD_S
    return due - into if into < bursts else due


def plan_orders(count: int, rng: random.Random) -> list[dict[str, Any]]:
    """Each order's payload: an amount, one or two items (a shipment each) and, for some, one
    remote fault."""
    plan = []
    for _ in range(count):
        payload: dict[str, Any] = {"amount": round(rng.uniform(5, 200), 2),
                                   "items": [{"sku": f"sku-{n}", "qty": 1} for n in range(rng.randint(1, 2))]}
        roll = rng.random()
        action = rng.choice(DO_ACTIONS)
        if roll < 0.10:
            payload["faults"] = {action: "transient:2"}
        elif roll < 0.15:
            payload["faults"] = {rng.choice(("charge", "ship")): "hang:30@1"}
        elif roll < 0.20:
            payload["faults"] = {action: "latency:0.3"}
        elif roll < 0.22:
            payload["faults"] = {"charge": "permanent"}
        plan.append(payload)
    return plan


class Chaos(Faults):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.home = Path(args.home or tempfile.mkdtemp(prefix=f"sas-chaos-{stamp}-"))
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        self.servers = Servers(self.home)
        self.rabbit = RabbitNode(self.home) if args.broker == "rabbitmq" else None
        self.injected: Counter[str] = Counter()
        self.timeline: list[dict[str, Any]] = []
        self.accepted: dict[str, str] = {}  # business key -> run id
        self.items: dict[str, int] = {}  # business key -> how many items (a shipment each)
        self.submit_failures: list[str] = []
        self.submit_retries = 0
        self.poison_keys: list[str] = []
        self.agent_names = [f"agent{i}" for i in range(args.agents)]
        self.fault_homes = 0
        self.background: list[threading.Thread] = []
        self.proxy: Proxy | None = None
        self.watch: Watch | None = None
        self.stop_asked = threading.Event()
        self.operated: dict[str, str] = {}
        self.operator_submitted = 0

    # setting up ---------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        s = self.servers
        ports = self.ports
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [CHECKOUT_PATH, os.environ.get("PYTHONPATH")])),
            "SAS_APP": "workers.app:sas",
            "SAS_HOME": str(self.home / "sas"),
            "SAS_DATABASE_URL": s.database_url,
            "SAS_BROKER_URL": self.broker_url(),
            "SAS_SUPERVISOR_INTERVAL": "1",
            "SAS_AT_RISK_INTERVAL": str(AT_RISK_INTERVAL),
            # each look logged (the Supervisor's log), for bench.at_risk_replay to replay at them
            "SAS_DEBUG_LOGS": "sas_app.supervision.forecast.watch",
            "SAS_PICKUP_TIMEOUT": "5",
            "SAS_RETRY_BACKOFF": "0.5",
            "SAS_RETRY_BACKOFF_MAX": "4",
            "SAS_VISIBILITY_TIMEOUT": "30",
            "SAS_TASK_EVENTS": "false",
            "SAS_BREAKER_FAIL_MAX": "0",
            "PAYMENT_SERVICE_URL": f"http://127.0.0.1:{ports['payment']}",
            "WAREHOUSE_SERVICE_URL": f"http://127.0.0.1:{ports['warehouse']}",
        }

    def start(self) -> None:
        # The submitting side's own logs (a broker or database down while it submits) go beside the
        # workers' logs, where the password scan reads them too.
        handler = logging.FileHandler(self.home / "logs" / "driver.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(logging.INFO)
        if self.rabbit:
            self.rabbit.start()
        else:
            self.servers.start_redis()
        self.servers.init_postgres()
        self.ports = {"payment": free_port(), "warehouse": free_port()}
        env = self.env()
        from sas_app import SasApp, Settings
        from workers.orders import install

        self.sas = SasApp(Settings.from_env(env))
        install(self.sas, charge_timeout=3.0, step_timeout=5.0, max_failures=self.args.max_failures,
                review_timeout=self.args.review_timeout)
        self.held = HeldOrders(self.sas, random.Random(self.args.seed + 1))
        self.sas.migrate()
        self.admin = create_engine(self.servers.admin_url, poolclass=NullPool)
        self.fleet = Processes(self.home, env)
        for name, port in self.ports.items():
            self.fleet.sas(name, f"{name}-service", "--port", str(port), "--ledger",
                           str(self.home / f"{name}-ledger.db"), ready=Ready(url=f"http://127.0.0.1:{port}/health"),
                           wait=False)
        # The Supervisor on a worker of its own, as the README deploys it: its looks at the queues
        # do not wait behind the Scheduler's tasks just when the Scheduler is busiest.
        self.fleet.worker("scheduler", "sas.scheduler", 2, wait=False)
        self.fleet.worker("supervisor", "sas.supervisor", 2, wait=False)
        self.proxy = Proxy(self.servers.pg_port)
        for name in self.agent_names:
            self.fleet.worker(name, AGENT_QUEUES, 2, env=self.agent_env(name), wait=False)
        for name in ("beat1", "beat2"):
            self.fleet.beat(name, wait=False)
        self.fleet.wait_ready()

    # the orders ---------------------------------------------------------------------------------

    def submit(self, key: str, payload: dict[str, Any], workflow: str = "order", reply_to: str | None = None) -> None:
        """Submit as a careful client does: on any error try again with the same business key (a
        run already written is returned, not written twice), for up to a minute."""
        deadline = time.monotonic() + 60
        self.items[key] = len(payload.get("items") or [None])
        while True:
            try:
                handle = self.sas.submit(workflow, payload, business_key=key, reply_to=reply_to)
                self.accepted[key] = handle.id
                return
            except Exception:
                self.submit_retries += 1
                if time.monotonic() > deadline:
                    self.submit_failures.append(key)
                    return
                self.pause(0.25)

    def plan(self) -> tuple[list[dict[str, Any]], list[tuple[float, str]]]:
        """The orders and the faults' schedule: of ``--seed``; a soak's in three parts one after
        another, of three seeds (``--seed`` and the two after it), each with a third of the
        orders and of each kind of fault."""
        args = self.args
        if not args.soak:
            orders = plan_orders(args.orders, self.rng)
            return orders, plan_chaos(args.each, args.orders / args.rate, self.rng)
        orders: list[dict[str, Any]] = []
        schedule: list[tuple[float, str]] = []
        for part in range(SOAK_SEEDS):
            rng = random.Random(args.seed + part)
            count = args.orders // SOAK_SEEDS + (args.orders % SOAK_SEEDS if part == SOAK_SEEDS - 1 else 0)
            offset = len(orders) / args.rate
            schedule += [(at + offset, kind) for at, kind in plan_chaos(-(-args.each // SOAK_SEEDS), count / args.rate,
                                                                        rng)]
            orders += plan_orders(count, rng)
        return orders, schedule

    def run(self) -> dict[str, Any]:
        args = self.args
        orders, schedule = self.plan()
        for payload in orders:
            for spec in (payload.get("faults") or {}).values():
                self.injected["remote_" + spec.split(":")[0].split("@")[0]] += 1
        if args.soak:
            self.watch = Watch(self.live_processes, self.open_connections)
            self.watch.start()
        started, self.started_at = time.monotonic(), time.time()
        chaos = threading.Thread(target=self.chaos, args=(schedule, started), daemon=True)
        chaos.start()
        for i, payload in enumerate(orders):
            self.pause(started + arrival(i, args.rate, args.bursts) - time.monotonic())
            key = f"order-{i:05d}"
            if self.held.is_held(i):  # waits for its manager's review, then a cooling-off sleep
                self.submit(key, payload, "held_order")
                self.held.review(key)
            else:  # one in ten asks to be told how it ends: its notifications go through the outbox
                self.submit(key, payload, reply_to=REPLIES if i % 10 == 0 else None)
        self.join(chaos, float("inf"))
        for thread in self.held.threads:
            self.join(thread, 120)
        for thread in self.background:  # an operator waiting for its order to reach error, say
            self.join(thread, ERROR_WITHIN_S)
        healed_at = time.monotonic()
        restarted = self.fleet.heal()
        finished = self.wait_for_the_end(args.bound)
        if self.watch is not None:
            self.watch.stop()
        return self.report(started, healed_at, finished, restarted)

    def live_processes(self) -> list[tuple[str, int]]:
        """The run's processes now, by name, this one (the submitting side) included."""
        with self.fleet.lock:
            return [(name, proc.pid) for name, proc in self.fleet.procs.items() if proc.poll() is None] + [own_pid()]

    def open_connections(self) -> int | None:
        """Database connections the stack holds open (PostgreSQL's own and the watch's not counted)."""
        with self.admin.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'")).scalar_one())

    def wait_for_the_end(self, bound: float) -> bool:
        from sas_app.store.tables import runs

        ids = list(self.accepted.values())
        deadline = time.monotonic() + bound

        def open_runs() -> int:
            with self.sas.store.engine.connect() as conn:
                rows = conn.execute(select(runs.c.process_state).where(runs.c.id.in_(ids))).scalars().all()
            return len(ids) - sum(state in TERMINAL_RUN_STATES for state in rows)

        while time.monotonic() < deadline:
            try:
                if open_runs() == 0:
                    return True
            except Exception:
                pass
            self.pause(0.5)
        return False

    # the figures --------------------------------------------------------------------------------

    def report(self, started: float, healed_at: float, finished: bool, restarted: list[str]) -> dict[str, Any]:
        from sas_app.store.tables import alerts, events, outbox, runs, steps

        ids = set(self.accepted.values())
        with self.sas.store.engine.connect() as conn:
            run_rows = {r.id: r for r in conn.execute(select(runs).where(runs.c.id.in_(ids)))}
            step_rows = [s for s in conn.execute(select(steps).where(steps.c.run_id.in_(ids)))]
            event_rows = [e for e in conn.execute(
                select(events).where(events.c.run_id.in_(ids)).order_by(events.c.id))]
            alert_rows = list(conn.execute(select(alerts).where(alerts.c.run_id.in_(ids))))
            notes = list(conn.execute(select(outbox.c.run_id, outbox.c.sent_at).where(outbox.c.run_id.in_(ids))))
        states = Counter(r.process_state for r in run_rows.values())
        lost = sorted(key for key, run_id in self.accepted.items() if run_id not in run_rows)
        not_terminal = sorted(r.business_key for r in run_rows.values() if r.process_state not in TERMINAL_RUN_STATES)
        reasons = Counter(reason(r.error) for r in run_rows.values() if r.process_state != "processed" and r.error)

        ledgers = {name: httpx.get(f"http://127.0.0.1:{port}/ledger", timeout=10).json()
                   for name, port in self.ports.items()}
        # One effect per order, action and step (a shipment per item: ``schedule_shipping:<i>``), whatever
        # run or key applied it: the same effect under two runs or two keys counts twice.
        applied: Counter[tuple[str, str, str, str]] = Counter()
        for service, entries in ledgers.items():
            for e in entries:
                applied[(service, e["order_id"], e["action"], e["idempotency_key"].split(":", 1)[-1])] += 1
        twice = sorted(f"{s} {order} {action} {step} x{n}" for (s, order, action, step), n in applied.items()
                       if n > 1)
        processed_keys = {r.business_key for r in run_rows.values() if r.process_state == "processed"}
        standing = sorted(f"{s} {e['order_id']} {e['action']}" for s, entries in ledgers.items() for e in entries
                          if not e["action"].startswith("undo:") and not e["undone_by"]
                          and e["order_id"] not in processed_keys)
        per_order = Counter((service, order, action) for service, order, action, _ in applied)
        missing = sorted(f"{key} {action}" for key in processed_keys for action, service, wanted in
                         (("reserve", "warehouse", 1), ("charge", "payment", 1),
                          ("ship", "warehouse", self.items.get(key, 1)))
                         if per_order[(service, key, action)] != wanted)

        recovery, by_cause = recovery_times(event_rows)
        # an attempt leaves "running" once, however many Supervisors and sweeps saw it expire at once
        left_running = Counter((e.run_id, e.position, e.attempt) for e in event_rows
                               if e.kind == "transition" and e.position is not None and e.from_state == "running")
        moved_twice = sorted(f"{run_id} step {position} attempt {attempt} x{n}"
                             for (run_id, position, attempt), n in left_running.items() if n > 1)
        attempts = Counter(s.attempt for s in step_rows if s.compensates is None and s.attempt > 0)
        latency = [r.updated_at - r.created_at for r in run_rows.values() if r.process_state in TERMINAL_RUN_STATES]
        plain = [r.updated_at - r.created_at for r in run_rows.values() if r.process_state == "processed"
                 and r.workflow == "order"]
        poison = []
        for key in self.poison_keys:
            run = run_rows.get(self.accepted.get(key, ""))
            charge = next((s for s in step_rows if run and s.run_id == run.id and s.name == "charge_payment"), None)
            poison.append({"key": key, "state": run.process_state if run else "missing",
                           "charge_attempts": charge.attempt if charge else None})
        children_lost = sum(self.fleet.log(n).count("Task handler raised error: WorkerLostError")
                            for n in self.agent_names)
        leaks = self.secrets_in_logs()
        # what became of the orders an operator acted on, and whether any run is live with nothing due
        operated = Counter(f"{kind} -> {run_rows[self.accepted[key]].process_state}"
                           for key, kind in self.operated.items() if self.accepted.get(key) in run_rows)
        stranded = self.sas.store.stranded_runs()
        # paused orders whose resume's message was lost: the Supervisor asked about them again
        paused = {self.accepted[key] for key, kind in self.operated.items() if kind == "operator_pause"}
        asked_again = {e.run_id for e in event_rows if e.run_id in paused and e.kind == "requeue"
                       and e.position is None and e.from_state == "processing"}

        outages = self.outages()
        # what the at-risk judge read, for replaying the forecast on this run (bench.at_risk_replay)
        with open(self.home / JUDGED, "wb") as out:
            pickle.dump({"started_at": self.started_at, "outages": outages, "timeline": self.timeline,
                         "agents": self.agent_names, "logs": {n: self.fleet.log(n) for n in self.agent_names},
                         "alerts": [dict(a._mapping) for a in alert_rows],
                         "events": [dict(e._mapping) for e in event_rows if e.kind == "transition"],
                         "steps": [{"run_id": s.run_id, "position": s.position, "agent": s.agent, "name": s.name,
                                    "compensates": s.compensates,
                                    "timeout": s.timeout, "completed_at": s.completed_at} for s in step_rows]},
                        out)
        result: dict[str, Any] = {
            "date": date.today().isoformat(),
            "command": "python -m bench.chaos " + " ".join(sys.argv[1:]),
            "seed": self.args.seed,
            "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
            "config": {"orders": self.args.orders, "rate_per_s": self.args.rate, "each": self.args.each,
                       "bursts_s": self.args.bursts,
                       "agent_workers": self.args.agents, "max_failures": self.args.max_failures,
                       "supervisor_interval_s": 1, "at_risk_interval_s": AT_RISK_INTERVAL,
                       "charge_timeout_s": 3, "step_timeout_s": 5,
                       "broker": self.broker_url().replace(self.secrets()[0], "***"),
                       "postgres": self.servers.database_url.replace(self.servers.pg_password, "***")},
            "fault_kinds": list(KINDS),  # each injected at least once (--each times)
            "faults_injected": dict(sorted(self.injected.items())),
            "timeline": self.timeline,
            "submitted": len(self.accepted),
            "submit_retries": self.submit_retries,
            "submit_gave_up": self.submit_failures,
            "processed": states["processed"],
            "compensated": states["compensated"],
            "error": states["error"],
            "cancelled": states["cancelled"],
            "not_processed_reasons": dict(reasons.most_common()),
            "lost": len(lost) + len(missing),
            "lost_runs": lost,
            "processed_without_their_effects": missing,
            "effects_applied_twice": len(twice),
            "effects_applied_twice_detail": twice,
            "attempts_moved_twice": moved_twice,
            "effects_left_standing": len(standing),
            "effects_left_standing_detail": standing,
            "not_terminal_within_bound": len(not_terminal),
            "not_terminal_detail": not_terminal[:50],
            "bound_s": self.args.bound,
            "all_ended_s_after_heal": round(time.monotonic() - healed_at, 1) if finished else None,
            "restarted_at_heal": restarted,
            "recovery_s": {"count": len(recovery), "p50": percentile(recovery, 50), "p99": percentile(recovery, 99),
                           "max": round(max(recovery), 3) if recovery else None, "by_cause": by_cause},
            "attempts_per_step": {str(k): v for k, v in sorted(attempts.items())},
            "latency_s": {"p50": percentile(latency, 50), "p99": percentile(latency, 99),
                          "orders_processed_p50": percentile(plain, 50), "orders_processed_p99": percentile(plain, 99)},
            "poison": poison,
            "operators": {"submitted": self.operator_submitted, "outcomes": dict(sorted(operated.items())),
                          "paused_asked_again": len(asked_again)},
            "stranded_runs": stranded.count,
            "held_orders": self.held.check(),
            "agent_children_lost": children_lost,
            "at_risk": {**alert_quality.judge(alert_rows, event_rows, {n: self.fleet.log(n) for n in self.agent_names},
                                              since=self.started_at, outages=outages),
                        # what an operator was told: one alert per queue and incident, at most one a
                        # sweep interval
                        "notifications": self.fleet.log("supervisor").count("ALERT at_risk")},
            # every notification relayed (the orders that asked to be told, each told at least that it ended)
            "notifications": len(notes),
            "outbox_unsent": sum(sent_at is None for _, sent_at in notes),
            "secrets_in_logs": leaks,
            "elapsed_s": round(time.monotonic() - started, 1),
            "home": str(self.home),
            "postgres_dir": str(self.servers.pg_root),
        }
        if self.watch is not None:
            result["soak"] = {"seconds": self.args.soak, **judge(self.watch, min(SOAK_WINDOW_S, self.args.soak / 3))}
        soak = result.get("soak", {})
        result["invariants_hold"] = not (result["lost"] or result["effects_applied_twice"] or moved_twice
                                         or result["outbox_unsent"] or stranded.count
                                         or soak.get("memory_flat") is False or soak.get("connections_flat") is False
                                         or result["held_orders"]["wrong"]
                                         or result["effects_left_standing"] or result["not_terminal_within_bound"]
                                         or leaks or self.submit_failures)
        return result

    def secrets_in_logs(self) -> int:
        """Lines, in every log this run wrote, that show a password."""
        found = 0
        rabbit = [*self.rabbit.root.glob("*.log"), *self.rabbit.root.glob("log/*.log")] if self.rabbit else []
        for path in [*self.home.glob("logs/*.log"), self.servers.redis_dir / "redis.log",
                     self.servers.pg_data.parent / "postgres.log", *rabbit]:
            if path.exists():
                text = path.read_text(errors="replace")
                found += sum(text.count(secret) for secret in self.secrets())
        return found

    def broker_url(self) -> str:
        return self.rabbit.url if self.rabbit else self.servers.redis_url

    def secrets(self) -> list[str]:
        """The broker's password first."""
        return [self.rabbit.password, self.servers.pg_password] if self.rabbit else self.servers.secrets()

    def stop(self) -> None:
        if hasattr(self, "fleet"):
            self.fleet.stop_all(grace=0)
        if hasattr(self, "sas"):
            self.sas.store.dispose()
        if hasattr(self, "admin"):
            self.admin.dispose()
        if self.proxy is not None:
            self.proxy.close()
        if self.rabbit:
            self.rabbit.stop()
        self.servers.stop()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=500, help="orders to submit (default 500)")
    # 7 orders/s: about 40 agent calls a second (an order is five or six: the fraud check and one
    # shipment per item), what 10/s of the four-call order used to be. At 10/s this 2-core machine
    # saturates and the figures measure the queue, not the faults.
    parser.add_argument("--rate", type=float, default=7.0, help="orders submitted per second (default 7)")
    parser.add_argument("--bursts", type=float, default=0.0, metavar="S",
                        help=f"each {BURST_PERIOD_S:g} s, submit the orders due in its first S seconds at once "
                             "(the same orders at the same average rate, in bursts; default 0: none)")
    parser.add_argument("--each", type=int, default=None,
                        help="how many times each kind of fault fires (default 2; 30 in a soak)")
    parser.add_argument("--soak", type=parse_duration, default=None, metavar="DURATION",
                        help="a soak: orders at --rate for this long (30m, 2h; overrides --orders) in three parts "
                             "of three seeds (--seed and the two after it), every kind of fault --each times in "
                             "all, with memory and database connections watched (the first and last 10 minutes "
                             "compared) and the outbox checked empty at the end")
    parser.add_argument("--seed", type=int, default=1, help="seed of the order and fault plans (default 1)")
    parser.add_argument("--agents", type=int, default=3, help="agent worker processes (default 3)")
    parser.add_argument("--max-failures", type=int, default=4, help="failed attempts a step may have (default 4)")
    parser.add_argument("--bound", type=float, default=180.0,
                        help="seconds after the last fault by which every run must have ended (default 180)")
    parser.add_argument("--review-timeout", type=float, default=20.0,
                        help="seconds a held order waits for its manager's review (default 20)")
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis",
                        help="the broker the run starts, restarts and empties (default redis)")
    parser.add_argument("--home", default=None, help="folder for servers, logs and ledgers (default: a new temp dir)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where chaos-<date>.json goes")
    parser.add_argument("--keep", action="store_true",
                        help="keep the home folder even when every invariant holds, with what the at-risk judge "
                             f"read ({JUDGED}: python -m bench.at_risk_replay HOME replays the forecast on it)")
    args = parser.parse_args(argv)
    if args.each is None:
        args.each = 30 if args.soak else 2
    if args.soak:
        args.orders = max(1, int(args.rate * args.soak))
    if args.orders < 1 or args.rate <= 0 or args.each < 1 or args.agents < 1 or args.max_failures < 2:
        parser.error("--orders, --rate, --each and --agents must be positive and --max-failures at least 2")
    if not 0 <= args.bursts < BURST_PERIOD_S:
        parser.error(f"--bursts must be from 0 to under {BURST_PERIOD_S:g} seconds, got {args.bursts:g}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    chaos = Chaos(args)
    interrupted = False
    # the first Ctrl-C or SIGTERM stops the run; any after it is ignored
    with stopped_by_signals() as chaos.stop_asked:
        try:
            chaos.start()
            result = chaos.run()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every process of the run stopped, nothing judged
            interrupted = True
        finally:
            with interrupts_ignored():  # a Ctrl-C now must not cut the stopping short either
                chaos.stop()
    if interrupted:
        print(f"interrupted: every process of the run stopped; logs and state: {chaos.home}", flush=True)
        return 130
    print_report(result)
    name = "chaos" if args.broker == "redis" else f"chaos-{args.broker}"
    record(args.out, f"soak-seed{args.seed}" if args.soak else name, result)
    if result["invariants_hold"] and not args.keep:
        shutil.rmtree(chaos.home, ignore_errors=True)
        print("logs and state removed (every invariant held; --keep keeps them)")
    else:
        print(f"logs and state: {chaos.home}")
    return 0 if result["invariants_hold"] else 1


if __name__ == "__main__":
    sys.exit(main())
