"""Many I/O-bound steps in one worker: ``async def`` actions on a thread pool against plain actions
on prefork, and a plain Celery chain, all calling the same remote service.

The service answers each request after ``--service-ms`` (100 ms), many at once (a threaded HTTP
server in this process). Each contender runs ``--runs`` runs of three calls to it, on real Redis
and PostgreSQL:

* sas_app, async actions: one agent worker ``-P threads -c --threads`` (each thread its event
  loop and its ``httpx.AsyncClient``);
* sas_app, plain actions: one agent worker ``-P prefork -c --processes``;
* the same three calls as a Celery chain on one worker ``-P prefork -c --processes``.

sas_app's Scheduler and Supervisor have a worker of their own (prefork, 2), and beat runs. Prints
and writes ``bench/results/async_agents-<date>.json``: steps per second (from the first submit to the last
run's end) and the agent worker's memory (its main process and pool, after the load). Usage:

    python -m bench.async_agents [--runs 200] [--service-ms 100] [--threads 50] [--processes 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import func, select

from bench.throughput import CHECKOUT_PATH, REPO, fresh_database, machine, record, rss_mb, service_arguments
from sas_app.testing.processes import CELERY_READY, Processes, stopped_by_signals


def slow_service(delay: float, seen: Callable[[str], None] | None = None) -> ThreadingHTTPServer:
    """A remote service on a free loopback port that answers every request after ``delay`` s;
    ``seen(path)`` is told of each request as it arrives."""

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if seen is not None:
                seen(self.path)
            time.sleep(delay)
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def sas_run(args: argparse.Namespace, env: dict[str, str], logs: Path, workflow: str, agent: str, pool: str,
            concurrency: int) -> dict[str, Any]:
    """One sas_app contender on a stack of its own: its runs, timed, and its agent worker's memory."""
    from bench.app import sas
    from sas_app.store.tables import runs

    procs = Processes(logs, env, cwd=REPO)
    try:
        procs.worker("scheduler", "sas.scheduler,sas.supervisor", 2)
        procs.worker("agent", f"sas.agent.{agent}", concurrency, pool=pool)
        procs.beat("beat")
        started = time.time()
        for i in range(args.runs):
            sas.submit(workflow, {}, business_key=f"{workflow}-{i}")
        with sas.store.engine.connect() as conn:
            where = runs.c.workflow == workflow
            deadline = time.monotonic() + args.timeout
            while conn.execute(select(func.count()).where(where, runs.c.process_state == "processed")
                               ).scalar_one() < args.runs:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{workflow}: runs did not finish in time")
                time.sleep(0.2)
                conn.commit()
            last = conn.execute(select(func.max(runs.c.updated_at)).where(where)).scalar_one()
        return {"steps_per_s": round(3 * args.runs / (last - started), 1), "elapsed_s": round(last - started, 2),
                "agent_rss_mb": rss_mb(procs.procs["agent"].pid), "pool": pool, "concurrency": concurrency}
    finally:
        procs.stop_all(grace=20)


def chain_run(args: argparse.Namespace, env: dict[str, str], logs: Path) -> dict[str, Any]:
    """The Celery chain: the same three calls, timed, and its worker's memory."""
    from celery import chain

    from bench.app import chain_app, chain_done, chain_slow

    chain_app.conf.broker_url = args.redis
    client = redis.Redis.from_url(args.redis)
    procs = Processes(logs, {**env, "BENCH_REDIS_URL": args.redis}, cwd=REPO)
    try:
        procs.start("chain", [sys.executable, "-m", "celery", "-A", "bench.app:chain_app", "worker", "-Q",
                              "bench.chain", "-c", str(args.processes), "-P", "prefork", "-l", "info",
                              "--without-gossip", "--without-mingle"], ready=CELERY_READY)
        key = "bench:async:chain"
        client.delete(key)
        started = time.time()
        for i in range(args.runs):
            chain(chain_slow.s(), chain_slow.s(), chain_slow.s(), chain_done.s(i, key)).apply_async()
        deadline = time.monotonic() + args.timeout
        while client.hlen(key) < args.runs:
            if time.monotonic() > deadline:
                raise RuntimeError("celery chains did not finish in time")
            time.sleep(0.2)
        last = max(float(v) for v in client.hgetall(key).values())
        return {"steps_per_s": round(3 * args.runs / (last - started), 1), "elapsed_s": round(last - started, 2),
                "agent_rss_mb": rss_mb(procs.procs["chain"].pid), "pool": "prefork", "concurrency": args.processes}
    finally:
        procs.stop_all(grace=20)
        client.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--service-ms", type=float, default=100)
    parser.add_argument("--threads", type=int, default=50, help="the async agent worker's threads")
    parser.add_argument("--processes", type=int, default=4, help="the prefork workers' processes")
    parser.add_argument("--timeout", type=float, default=600)
    service_arguments(parser, redis_db=13)
    args = parser.parse_args(argv)
    logs = Path(os.environ.get("BENCH_LOGS", "/tmp/sas-bench")) / "async"
    redis.Redis.from_url(args.redis).flushdb()
    server = slow_service(args.service_ms / 1000)
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    db_url = fresh_database(args.postgres, "sas_bench_async")
    env = {**os.environ, "SAS_APP": "bench.app:sas", "SAS_DATABASE_URL": db_url, "SAS_BROKER_URL": args.redis,
           "SAS_HOME": str(logs / "home"), "PYTHONPATH": CHECKOUT_PATH, "BENCH_SLOW_URL": url}
    os.environ.update({k: env[k] for k in ("SAS_DATABASE_URL", "SAS_BROKER_URL", "SAS_HOME", "BENCH_SLOW_URL")})
    from bench.app import sas

    sas.migrate()
    print(f"{args.runs} runs of three {args.service_ms:g} ms calls each", flush=True)
    with stopped_by_signals():
        contenders = {
            "sas_app_async_threads": sas_run(args, env, logs / "async", "slow3_async", "slow_async", "threads",
                                             args.threads),
            "sas_app_plain_prefork": sas_run(args, env, logs / "plain", "slow3_sync", "slow_sync", "prefork",
                                             args.processes),
            "celery_chain_prefork": chain_run(args, env, logs / "chain"),
        }
    server.shutdown()
    sas.store.dispose()
    for name, figures in contenders.items():
        print(f"  {name:24} {figures['steps_per_s']:7.1f} steps/s   agent worker {figures['agent_rss_mb']:6.1f} MB"
              f"   ({figures['pool']}, {figures['concurrency']})", flush=True)
    result = {"date": date.today().isoformat(),
              "command": "python -m bench.async_agents " + " ".join(argv if argv is not None else sys.argv[1:]),
              "runs": args.runs, "service_ms": args.service_ms, "machine": machine(), **contenders}
    record(args.out, "async_agents", result)
    return result


if __name__ == "__main__":
    main()
