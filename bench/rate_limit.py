"""A rate limit held by a fleet: four agent workers share one agent's limit, and the service counts
what reaches it.

The service (a threaded HTTP server in this process) notes when each request arrives and answers
after ``--service-ms``. ``--workers`` agent workers of ``--concurrency`` processes each consume the
agent ``limited``, whose ``rate_limit`` is ``--limit`` — on Redis (the broker's), and with
``--brokers rabbitmq`` in the state store (PostgreSQL). ``--runs`` runs of one call each are
submitted at once, so every process always has a call to make. Each pool process opens its HTTP
client as it starts (as the docs advise); ``--cold-clients`` opens it at its first call instead,
which then reaches the service late, bunched with the next on-time calls.

Prints and writes ``bench/results/rate_limit-<date>.json``: the rate the service saw over the
whole run and in its steady middle (the first and last seconds cut off), the calls in each second,
the most in any second (a window sliding over every arrival), and the longest stretch of whole
seconds over the limit — the goals: within 5 % of the limit, never over it for more than a second.
Usage: ``python -m bench.rate_limit [--limit 20] [--runs 1200] [--workers 4] [--concurrency 4] [--cold-clients]``
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from bisect import bisect_left
from datetime import date
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from bench.async_agents import slow_service
from bench.throughput import REPO, bench_stack, machine, record, service_arguments
from sas_app import Submission
from sas_app.testing.processes import Processes, stopped_by_signals


def recording_service(delay: float) -> tuple[ThreadingHTTPServer, list[float]]:
    """A service on a free loopback port that notes each request's arrival, then answers after
    ``delay`` (a pool process's warm-up request, to ``/warm``, is not noted)."""
    arrivals: list[float] = []
    lock = threading.Lock()

    def seen(path: str) -> None:
        if not path.endswith("warm"):
            with lock:
                arrivals.append(time.time())

    return slow_service(delay, seen), arrivals


def judge(arrivals: list[float], limit: float) -> dict[str, Any]:
    """What the service saw: rates, calls per whole second, the most in any second, and the longest
    run of whole seconds over the limit."""
    times = sorted(arrivals)
    first, last = times[0], times[-1]
    per_second = [0] * (int(last - first) + 1)
    for t in times:
        per_second[int(t - first)] += 1
    middle = [t for t in times if first + 2 <= t < last - 2]
    longest = run = 0
    for count in per_second:
        run = run + 1 if count > limit else 0
        longest = max(longest, run)
    window = max(bisect_left(times, t + 1) - i for i, t in enumerate(times))
    return {
        "calls": len(times), "span_s": round(last - first, 2),
        "rate": round((len(times) - 1) / (last - first), 2),
        "steady_rate": round((len(middle) - 1) / (middle[-1] - middle[0]), 2) if len(middle) > 1 else None,
        "most_in_any_second": window,
        "seconds_over_limit": sum(1 for count in per_second[:-1] if count > limit),
        "longest_over_limit_s": longest,
        "per_second": per_second,
    }


def run_once(args: argparse.Namespace, broker: str, logs: Path) -> dict[str, Any]:
    server, arrivals = recording_service(args.service_ms / 1000)
    env = bench_stack(args, "rate_limit", logs)
    if broker != "redis":
        env["SAS_BROKER_URL"] = os.environ["SAS_BROKER_URL"] = args.rabbitmq
    env.update({"BENCH_RATE_LIMIT": f"{args.limit:g}/s", "BENCH_COLD_CLIENTS": str(args.cold_clients).lower(),
                "BENCH_LIMITED_URL": f"http://127.0.0.1:{server.server_address[1]}/"})
    from bench.app import sas  # after the environment names the stack
    from sas_app.store.tables import events, runs

    sas.celery.conf.broker_url = env["SAS_BROKER_URL"]
    sas.migrate()
    procs = Processes(logs / broker, env, cwd=REPO)
    try:
        procs.worker("scheduler", "sas.scheduler,sas.supervisor", 2, wait=False)
        procs.beat("beat", wait=False)
        for n in range(args.workers):
            procs.worker(f"agent-{n}", "sas.agent.limited", args.concurrency, wait=False)
        procs.wait_ready()
        started = time.monotonic()
        sas.submit_many([Submission("limited1", {}, f"limited-{i}") for i in range(args.runs)])
        with sas.store.engine.connect() as conn:
            deadline = started + args.runs / args.limit * 2 + 60
            while conn.execute(select(func.count()).where(runs.c.process_state == "processed")).scalar_one() \
                    < args.runs:
                if time.monotonic() > deadline:
                    raise RuntimeError("the runs did not end in time")
                time.sleep(0.5)
                conn.commit()
            deferred = conn.execute(select(func.count()).select_from(events).where(
                events.c.kind == "transition", events.c.from_state == "running",
                events.c.to_state == "pending")).scalar_one()
            retried = conn.execute(select(func.count()).select_from(events).where(
                events.c.kind == "transition", events.c.to_state == "running", events.c.attempt > 1)).scalar_one()
    finally:
        procs.stop_all(grace=10)
        sas.store.dispose()
        server.shutdown()
    return {"broker": broker, "shared_in": "redis" if broker == "redis" else "postgresql",
            "deferred": deferred, "attempts_after_the_first": retried, **judge(arrivals, args.limit)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=float, default=20.0, help="the agent's rate limit, calls a second")
    parser.add_argument("--runs", type=int, default=1200)
    parser.add_argument("--workers", type=int, default=4, help="agent workers (separate processes)")
    parser.add_argument("--concurrency", type=int, default=4, help="each agent worker's -c")
    parser.add_argument("--service-ms", type=float, default=20)
    parser.add_argument("--brokers", default="redis,rabbitmq")
    parser.add_argument("--cold-clients", action="store_true", help="open each process's client at its first call")
    parser.add_argument("--rabbitmq", default=os.environ.get("SAS_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672"))
    service_arguments(parser, redis_db=12)
    args = parser.parse_args(argv)
    logs = Path(os.environ.get("BENCH_LOGS", "/tmp/sas-bench/rate_limit"))
    result: dict[str, Any] = {"date": date.today().isoformat(), "machine": machine(), "limit": args.limit,
                              "runs": args.runs, "workers": args.workers, "concurrency": args.concurrency,
                              "service_ms": args.service_ms, "cold_clients": args.cold_clients}
    for broker in args.brokers.split(","):
        outcome = run_once(args, broker, logs)
        result[broker] = outcome
        print(json.dumps({k: v for k, v in outcome.items() if k != "per_second"}), flush=True)
    record(args.out, "rate_limit", result)
    return result


if __name__ == "__main__":
    with stopped_by_signals():  # Ctrl-C or SIGTERM: the bench's own finally stops every process it started
        main()
