"""Back-pressure: an agent's queue ten times deeper than it can drain within its steps' complete-by.

1. Real worker and beat processes (the Supervisor sweeps every second): one agent worker whose
   action takes a fixed ``--service`` seconds, ``--concurrency`` of them at once; a warm-up of a
   few runs gives the Supervisor the agent's pace.
2. ``--depth`` times what the agent drains within a step's ``--timeout`` is submitted in bulk, at
   once (a burst; with ``--restart-agent`` just as the agent worker is restarted).
3. Every half second until every run has ended: the queue's depth, steps completed, attempts given
   up at their complete-by (recoveries), retries waiting for room (paced), messages sent to the agent.

Run twice, with the Supervisor's pacing of retries (SAS_PACE_RETRIES, the default) and without,
so that the retry storm it prevents shows: without it every expired attempt goes straight back
into the backlog, to expire there again until its step fails for good. Nothing may be lost either
way. Writes ``bench/results/backpressure-<date>.json``.
Usage: ``python -m bench.backpressure [--depth 10] [--timeout 5] [--service 0.05] [--concurrency 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time
from collections import Counter
from datetime import date
from itertools import pairwise
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import func, select

from bench.alert_quality import judge
from bench.throughput import CHECKOUT_PATH, REPO, fresh_database, machine, percentile, record, service_arguments
from sas_app import Submission
from sas_app.messaging.routing import SWEEP
from sas_app.states import TERMINAL_RUN_STATES
from sas_app.testing.processes import Processes, stopped_by_signals

WARM = 20
#: the Scheduler worker's log line for a sweep done, with how long it took
SWEPT = re.compile(re.escape(SWEEP) + r"\[[^\]]+\] succeeded in ([0-9.]+)s")


def run_once(args: argparse.Namespace, pace: bool, logs: Path) -> dict[str, Any]:
    db_url = fresh_database(args.postgres, "sas_bench_backpressure")
    redis.Redis.from_url(args.redis).flushdb()
    env = {**os.environ, "SAS_APP": "bench.app:sas", "SAS_DATABASE_URL": db_url, "SAS_BROKER_URL": args.redis,
           "SAS_HOME": str(logs / "home"), "SAS_TASK_EVENTS": "false", "SAS_SUPERVISOR_INTERVAL": "1",
           "SAS_AT_RISK_INTERVAL": "0.1", "SAS_PACE_RETRIES": str(pace).lower(), "BENCH_SERVICE_S": str(args.service),
           "BENCH_STEP_TIMEOUT": str(args.timeout), "PYTHONPATH": CHECKOUT_PATH}
    os.environ.update({k: env[k] for k in ("SAS_DATABASE_URL", "SAS_BROKER_URL", "SAS_HOME", "SAS_TASK_EVENTS",
                                           "BENCH_SERVICE_S", "BENCH_STEP_TIMEOUT")})
    from bench.app import sas  # after the environment names the stack
    from sas_app.messaging.routing import agent_queue
    from sas_app.store.tables import alerts, events, runs, steps

    sas.migrate()
    queue = agent_queue("steady")

    def scalar(query: Any) -> int:
        with sas.store.engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def depth() -> int:
        with sas.celery.connection_for_read() as conn:
            try:
                return int(conn.default_channel.queue_declare(queue=queue, passive=True).message_count)
            except Exception:
                return 0

    def ended() -> int:
        return scalar(select(func.count()).where(runs.c.process_state.in_(TERMINAL_RUN_STATES)))

    dispatched = select(func.count()).select_from(events).where(events.c.kind == "transition",
                                                                events.c.to_state == "running")
    expired = select(func.count()).select_from(events).where(events.c.kind == "transition",
                                                             events.c.from_state == "running",
                                                             events.c.to_state.in_(("pending", "failed")))
    completed = select(func.count()).select_from(steps).where(steps.c.state == "completed")
    paced = select(func.count()).select_from(steps).where(steps.c.state == "pending", steps.c.attempt > 0)
    folder = logs / ("paced" if pace else "unpaced")
    shutil.rmtree(folder, ignore_errors=True)  # the sweeps are read from its logs: this run's alone
    procs = Processes(folder, env, cwd=REPO)
    series: list[dict[str, Any]] = []
    try:
        procs.worker("scheduler", "sas.scheduler,sas.supervisor", 2)
        procs.beat("beat")
        procs.worker("agent", queue, args.concurrency)
        sas.submit_many([Submission("steady1", {}, f"warm-{i}") for i in range(WARM)])
        deadline = time.monotonic() + 60
        while ended() < WARM:
            if time.monotonic() > deadline:
                raise RuntimeError("the warm-up runs did not end within 60 s")
            time.sleep(0.2)
        drain = args.concurrency / args.service  # what the agent works a second, at most
        burst = int(args.depth * drain * args.timeout)
        if args.restart_agent:  # the burst lands while the agent worker starts again
            procs.restart("agent", wait=False)
        started = time.monotonic()
        for at in range(0, burst, 1000):
            sas.submit_many([Submission("steady1", {}, f"burst-{i}") for i in range(at, min(at + 1000, burst))])
        submitted_s = time.monotonic() - started
        before = {"completed": scalar(completed), "expired": scalar(expired), "dispatched": scalar(dispatched)}
        deadline = started + args.bound
        while True:
            at = round(time.monotonic() - started, 1)
            now = {"completed": scalar(completed), "expired": scalar(expired), "dispatched": scalar(dispatched)}
            series.append({"t": at, "depth": depth(), "paced": scalar(paced), "ended": ended() - WARM,
                           **{k: v - before[k] for k, v in now.items()}})
            if series[-1]["ended"] >= burst or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        with sas.store.engine.connect() as conn:
            states = Counter(dict(conn.execute(select(runs.c.process_state, func.count())
                                               .where(runs.c.business_key.like("burst-%"))
                                               .group_by(runs.c.process_state)).all()))
            attempts = Counter(dict(conn.execute(
                select(steps.c.attempt, func.count()).join(runs, runs.c.id == steps.c.run_id)
                .where(runs.c.business_key.like("burst-%")).group_by(steps.c.attempt)).all()))
            lost = burst - sum(states.values())
            sent = scalar(select(func.count()).select_from(events).join(runs, runs.c.id == events.c.run_id)
                          .where(runs.c.business_key.like("burst-%"), events.c.kind == "transition",
                                 events.c.to_state == "running"))
            # how far the at-risk warnings raised for the burst could be trusted
            every_event = list(conn.execute(select(events).order_by(events.c.id)))
            at_risk = judge(list(conn.execute(select(alerts))), every_event, {"agent": procs.log("agent")})
    finally:
        procs.stop_all(grace=10)
        sas.store.dispose()

    # what reading the backlog (the at-risk warnings, the pacing of retries) costs a sweep
    sweeps = [float(took) for took in SWEPT.findall(procs.log("scheduler"))]

    def per_second(key: str) -> list[float]:
        return [round((b[key] - a[key]) / max(b["t"] - a["t"], 0.1), 1) for a, b in pairwise(series)]

    return {
        "pace_retries": pace, "runs": burst, "submitted_per_s": round(burst / submitted_s),
        "all_ended_s": series[-1]["t"] if series else None, "ended_within_bound": series[-1]["ended"] >= burst,
        "states": dict(states), "lost": lost, "attempts_per_step": {str(k): v for k, v in sorted(attempts.items())},
        "messages_per_step": round(sent / burst, 2), "depth_max": max(p["depth"] for p in series),
        "completions_per_s_p50": percentile(per_second("completed"), 50),
        "recoveries_per_s_max": max(per_second("expired"), default=0.0),
        "at_risk": {k: v for k, v in at_risk.items() if k not in ("wrong_at", "unforeseen_at")},
        "sweep_s": {"count": len(sweeps), "p50": percentile(sweeps, 50), "p99": percentile(sweeps, 99),
                    "max": max(sweeps)} if sweeps else None,
        "series": series,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=float, default=10.0, help="the burst, in times what drains within a timeout")
    parser.add_argument("--timeout", type=float, default=5.0, help="a step's complete-by, in seconds")
    parser.add_argument("--service", type=float, default=0.05, help="seconds the agent's action takes")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--bound", type=float, default=600.0, help="seconds every run has to end in")
    parser.add_argument("--only-paced", action="store_true", help="skip the run without pacing")
    parser.add_argument("--restart-agent", action="store_true",
                        help="restart the agent worker (SIGKILL, then start) just before the burst")
    service_arguments(parser, redis_db=12)
    args = parser.parse_args(argv)
    logs = Path(os.environ.get("BENCH_LOGS", "/tmp/sas-bench/backpressure"))
    result: dict[str, Any] = {"date": date.today().isoformat(), "machine": machine(), "depth": args.depth,
                              "timeout_s": args.timeout, "service_s": args.service, "concurrency": args.concurrency,
                              "restart_agent": args.restart_agent}
    for pace in (True,) if args.only_paced else (True, False):
        outcome = run_once(args, pace, logs)
        result["paced" if pace else "unpaced"] = outcome
        print(json.dumps({k: v for k, v in outcome.items() if k != "series"}), flush=True)
    record(args.out, "backpressure-restart-agent" if args.restart_agent else "backpressure", result)
    return result


if __name__ == "__main__":
    with stopped_by_signals():  # Ctrl-C or SIGTERM: the bench's own finally stops every process it started
        main()
