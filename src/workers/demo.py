"""``sas demo``: the whole pattern live — real worker, beat and payment-service processes — with
faults injected, a live view of runs by state, and a summary of what happened.

With no SAS_* environment it runs on the embedded default (SQLite and kombu's filesystem
transport under a fresh folder); with SAS_BROKER_URL / SAS_DATABASE_URL set it uses those.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sas_app import RunState, SasApp, Settings
from sas_app.testing import Processes, Ready, free_port, stopped_by_signals

from .orders import ORDER_WORKFLOW, install

AGENT_QUEUES = "sas.agent.payment,sas.agent.fraud,sas.agent.warehouse,sas.agent.orders"


def plan_faults(orders: int, rate: float, rng: random.Random) -> list[str | None]:
    """One fault spec (or None) per order: transient errors, hangs past complete-by, latency,
    and exactly one permanent failure (each kind at least once while ``rate`` > 0)."""
    plan: list[str | None] = []
    for _ in range(orders):
        if rng.random() >= rate:
            plan.append(None)
            continue
        plan.append(rng.choices(["transient:2", "hang:30@1", "latency:0.5"], weights=[5, 3, 2])[0])
    # However the dice fell, show each kind of fault at least once.
    for kind in ("permanent", "hang:30@1", "transient:2"):
        free = [i for i, f in enumerate(plan) if f is None or f == "latency:0.5"]
        if kind not in plan and free and (rate > 0 or kind == "permanent"):
            plan[rng.choice(free)] = kind
    return plan


class ProcessGone(Exception):
    """A process the demo started exited while the demo ran (its message names it and its log's end)."""


def _all_running(procs: Processes, names: list[str]) -> None:
    """Raise :class:`ProcessGone` if one of ``names`` has exited: the demo would wait for it in vain."""
    try:
        procs.check_running(*names)
    except RuntimeError as exc:
        raise ProcessGone(f"the demo's {exc}") from None


def run_demo(orders: int, fault_rate: float, seed: int, timeout: float, as_json: bool) -> dict[str, Any]:
    console = Console(stderr=as_json)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # a folder of its own, on the embedded default and on a server stack alike: its services'
    # ledgers, logs and (embedded) store hold this demo's orders only
    home = Path(os.environ.get("SAS_HOME", ".sas")).resolve() / f"demo-{stamp}-{os.getpid()}"
    home.mkdir(parents=True, exist_ok=True)
    ports = {"payment": free_port(), "warehouse": free_port()}
    env = {
        **os.environ,
        "SAS_HOME": str(home),
        "SAS_APP": "workers.app:sas",
        "SAS_SUPERVISOR_INTERVAL": os.environ.get("SAS_SUPERVISOR_INTERVAL", "1"),
        "SAS_RETRY_BACKOFF": os.environ.get("SAS_RETRY_BACKOFF", "0.5"),
        "SAS_PICKUP_TIMEOUT": os.environ.get("SAS_PICKUP_TIMEOUT", "5"),
        "SAS_TASK_EVENTS": os.environ.get("SAS_TASK_EVENTS", "false"),
        "PAYMENT_SERVICE_URL": f"http://127.0.0.1:{ports['payment']}",
        "WAREHOUSE_SERVICE_URL": f"http://127.0.0.1:{ports['warehouse']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                    os.environ.get("PYTHONPATH")])),
    }
    sas = SasApp(Settings.from_env(env))
    # short complete-bys, so that the steps the agent worker's crash strands (Redis keeps a message
    # in hand until its visibility timeout) are recovered within seconds, not ten of them
    install(sas, charge_timeout=2.0, step_timeout=5.0)
    sas.migrate()
    procs = Processes(home, env)
    services = {name: Ready(url=f"http://127.0.0.1:{port}/health") for name, port in ports.items()}
    rng = random.Random(seed)
    started = time.monotonic()
    summary: dict[str, Any] = {}

    # Ctrl-C or SIGTERM: the first raises KeyboardInterrupt and sets ``asked``, which the loops
    # below check too, since Python may raise it where it is only printed (a weakref's callback)
    with stopped_by_signals() as asked, _stopping(procs, sas):
        for name, port in ports.items():
            procs.sas(name, f"{name}-service", "--port", str(port), "--ledger", str(home / f"{name}-ledger.db"),
                      ready=services[name], wait=False)
        procs.worker("scheduler", "sas.scheduler,sas.supervisor", 2, wait=False)
        procs.worker("agents", AGENT_QUEUES, 4, wait=False)
        procs.beat("beat", wait=False)
        procs.wait_ready(*services)

        watched = [*ports, "scheduler", "agents", "beat"]
        prefix = f"demo-{stamp}-{seed}"
        handles = []
        for i, fault in enumerate(plan_faults(orders, fault_rate, rng)):
            _unless(asked)
            if i % 20 == 0:  # a process gone while the orders go in: say so now, not after the last
                _all_running(procs, watched)
            payload: dict[str, Any] = {"amount": round(rng.uniform(5, 200), 2),
                                       "items": [{"sku": f"sku-{n}", "qty": 1} for n in range(rng.randint(1, 3))]}
            if fault:
                payload["faults"] = {"charge": fault}
            handles.append(sas.submit(ORDER_WORKFLOW, payload, business_key=f"{prefix}-{i:05d}"))
        ids = [h.id for h in handles]

        crashed = False
        deadline = time.monotonic() + timeout
        progress = Progress(TextColumn("orders"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.description}"), console=console, transient=as_json)
        bar = progress.add_task("", total=orders)
        with progress:
            while True:
                _unless(asked)
                _all_running(procs, watched)
                counts = sas.store.count_states(ids)  # this demo's runs, not the store's
                done = sum(counts.get(s, 0) for s in RunState if s.finished)
                progress.update(bar, completed=done, description="  ".join(
                    f"{state} {counts[state]}" for state in RunState if counts.get(state)))
                if not crashed and done >= orders // 3:
                    procs.restart("agents")  # one worker crash, mid-run
                    crashed = True
                if done >= orders or time.monotonic() > deadline:
                    break
                asked.wait(0.2)
        summary = _summary(sas, ids, ports, time.monotonic() - started)
        summary["home"] = str(home)
    return summary


def _unless(asked: threading.Event) -> None:
    """Go on unless a Ctrl-C or SIGTERM came (its KeyboardInterrupt may have been lost)."""
    if asked.is_set():
        raise KeyboardInterrupt


@contextmanager
def _stopping(procs: Processes, sas: SasApp) -> Iterator[None]:
    """Every process the demo started stopped on the way out, however it goes."""
    try:
        yield
    finally:
        procs.stop_all()
        sas.store.dispose()


def _summary(sas: SasApp, ids: list[str], ports: dict[str, int], elapsed: float) -> dict[str, Any]:
    runs = [sas.store.get_run(run_id) for run_id in ids]  # this demo's orders: the ledgers are its own too
    states = Counter(run.process_state if run else "missing" for run in runs)
    retried = alerts = at_risk = shipments = 0
    for run_id in ids:
        shipments += sum(s.branch_of is not None and s.state == "completed" for s in sas.store.get_steps(run_id))
        for e in sas.store.get_events(run_id):
            retried += (e.kind, e.from_state, e.to_state) == ("transition", "running", "pending") and not (
                e.detail and "deferred" in e.detail)
            alerts += e.kind == "alert" and e.detail["kind"] != "at_risk"
            at_risk += e.kind == "alert" and e.detail["kind"] == "at_risk"
    ledger = httpx.get(f"http://127.0.0.1:{ports['payment']}/ledger", timeout=5).json()
    charges = [e for e in ledger if e["action"] == "charge"]
    per_order = Counter(e["order_id"] for e in charges)
    processed = {run.business_key for run in runs if run and run.process_state == "processed"}
    return {
        "submitted": len(ids),
        "processed": states["processed"],
        "shipments": shipments,  # one branch per item, up to five at once
        "retried_by_supervisor": retried,
        "compensated": states["compensated"],
        "error": states["error"],
        "alerts": alerts,
        "at_risk_warnings": at_risk,
        "lost": sum(n for state, n in states.items() if not RunState(state).finished),
        "duplicate_charges": sum(n - 1 for n in per_order.values() if n > 1),
        # a charge still standing on an order that did not complete: compensation missed it
        "charges_not_undone": len({e["order_id"] for e in charges if not e["undone_by"]} - processed),
        "charges": len(charges),
        # why each order that did not complete ended as it did: undone (the declined card the demo
        # injects, most often) or in error (an operator's turn)
        "undone": [f"{run.business_key}: {run.error}" for run in runs
                   if run and run.error and run.process_state != "error"],
        "errors": [f"{run.business_key}: {run.error}" for run in runs if run and run.process_state == "error"],
        "elapsed_s": round(elapsed, 2),
    }


def print_summary(summary: dict[str, Any]) -> None:
    console = Console()
    table = Table(title="sas demo")
    table.add_column("what")
    table.add_column("count", justify="right")
    for key in ("submitted", "processed", "shipments", "retried_by_supervisor", "compensated", "error", "alerts",
                "at_risk_warnings", "lost", "duplicate_charges", "charges_not_undone", "elapsed_s"):
        table.add_row(key.replace("_", " "), str(summary[key]))
    console.print(table)
    for line in summary["undone"]:
        console.print(f"undone, as the demo intends (it declines one card): {line}")
    for line in summary["errors"]:
        console.print(f"[bold red]in error, needs an operator:[/] {line}")
    console.print(f"state and logs: {summary['home']}  (SAS_HOME={summary['home']} sas runs, or sas dashboard)")
