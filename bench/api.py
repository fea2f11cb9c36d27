"""The HTTP API's cost beside Python's: submit and get-run latency (p50, p99) one request at a
time, and submissions per second with several clients at once, through a real ``sas dashboard``
(waitress) on PostgreSQL and Redis, against ``sas.submit`` and ``sas.get_run`` called in-process.

A submission is measured up to its answer: the run and its steps written, its first step's message
sent (no agent takes it; what follows a submit is the throughput bench's). Every client reuses
its HTTP connection, as a service's client would.

Writes ``bench/results/api-<date>.json``. Usage: ``python -m bench.api [--requests 2000 --clients 8]``
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import redis

from bench.throughput import REPO, bench_stack, machine, percentile, record, service_arguments
from sas_app.testing.processes import Processes, Ready, free_port, stopped_by_signals

WORKFLOW = "noop3"


def latencies(calls: int, one: Callable[[int], None]) -> dict[str, float]:
    """``one(i)`` ``calls`` times in a row: the latency's p50 and p99 (ms) and the calls per second."""
    took = []
    started = time.perf_counter()
    for i in range(calls):
        t0 = time.perf_counter()
        one(i)
        took.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    return {"p50_ms": round(1000 * percentile(took, 50), 2), "p99_ms": round(1000 * percentile(took, 99), 2),
            "per_s": round(calls / elapsed, 1)}


def at_once(clients: int, calls: int, make: Callable[[], Callable[[int], None]]) -> float:
    """``calls`` calls shared out among ``clients`` threads, each with its own client (``make()``):
    calls per second."""
    per = calls // clients
    ready = threading.Barrier(clients + 1, timeout=60)

    def client() -> None:
        one = make()
        ready.wait()
        for i in range(per):
            one(i)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    ready.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return round(per * clients / (time.perf_counter() - started), 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests of each kind, one at a time")
    parser.add_argument("--clients", type=int, default=8, help="clients at once, for the throughput")
    parser.add_argument("--threads", type=int, default=8, help="the dashboard's server threads")
    service_arguments(parser, redis_db=15)
    args = parser.parse_args(argv)

    logs = Path(os.environ.get("BENCH_LOGS", "/tmp/sas-bench/api"))
    env = bench_stack(args, "api", logs)
    from bench.app import sas  # after the environment names the stack

    sas.migrate()
    _, token = sas.tokens.create("bench", "operator", by="bench")
    port = free_port()
    base = f"http://127.0.0.1:{port}/api/v1"
    procs = Processes(logs, env, cwd=REPO)
    prefix = uuid.uuid4().hex[:6]
    try:
        procs.sas("dashboard", "dashboard", "--port", str(port), "--threads", str(args.threads),
                  ready=Ready(url=f"http://127.0.0.1:{port}/healthz"))
        headers = {"Authorization": f"Bearer {token}"}
        http = httpx.Client(base_url=base, headers=headers, timeout=30)
        ids: list[str] = []

        def api_submit(i: int, client: httpx.Client = http, kind: str = "api") -> None:
            body = {"workflow": WORKFLOW, "payload": {}, "business_key": f"{prefix}-{kind}-{i}"}
            answer = client.post("/runs", json=body)
            assert answer.status_code == 201, answer.text
            ids.append(answer.json()["run"]["id"])

        def py_submit(i: int, kind: str = "py") -> None:
            sas.submit(WORKFLOW, {}, business_key=f"{prefix}-{kind}-{i}")

        result: dict[str, Any] = {"date": date.today().isoformat(), "machine": machine(), "requests": args.requests,
                                  "clients": args.clients, "server_threads": args.threads, "workflow": WORKFLOW}
        for name, one in (("python_submit", py_submit), ("api_submit", api_submit)):
            one(-1, kind=f"warm-{name}")
            result[name] = latencies(args.requests, one)
        result["python_get_run"] = latencies(args.requests, lambda i: sas.get_run(ids[i % len(ids)]))
        result["api_get_run"] = latencies(args.requests, lambda i: http.get(f"/runs/{ids[i % len(ids)]}")
                                          .raise_for_status())

        def api_client() -> Callable[[int], None]:
            own, tag = httpx.Client(base_url=base, headers=headers, timeout=30), uuid.uuid4().hex[:6]
            return lambda i: api_submit(i, own, f"many-{tag}")

        def py_client() -> Callable[[int], None]:
            tag = uuid.uuid4().hex[:6]
            return lambda i: py_submit(i, f"many-{tag}")

        result["python_submit_at_once_per_s"] = at_once(args.clients, args.requests, py_client)
        result["api_submit_at_once_per_s"] = at_once(args.clients, args.requests, api_client)
        result["api_over_python_submit_p50"] = round(result["api_submit"]["p50_ms"] /
                                                     result["python_submit"]["p50_ms"], 2)
        result["api_over_python_submit_at_once"] = round(result["api_submit_at_once_per_s"] /
                                                         result["python_submit_at_once_per_s"], 2)
        http.close()
    finally:
        procs.stop_all(grace=5)
        sas.store.dispose()
        redis.Redis.from_url(args.redis).flushdb()
    for key in ("python_submit", "api_submit", "python_get_run", "api_get_run"):
        print(f"{key:>16}: p50 {result[key]['p50_ms']:>7} ms, p99 {result[key]['p99_ms']:>7} ms, "
              f"{result[key]['per_s']:>7}/s one at a time", flush=True)
    print(f"submissions with {args.clients} clients at once: python {result['python_submit_at_once_per_s']}/s, "
          f"api {result['api_submit_at_once_per_s']}/s", flush=True)
    record(args.out, "api", result)
    return result


if __name__ == "__main__":
    with stopped_by_signals():  # Ctrl-C or SIGTERM: the bench's own finally stops every process it started
        main()
