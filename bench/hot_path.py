"""PostgreSQL's CPU per step of the hot path alone, as the number of clients grows.

Each client is a process that submits ``noop3`` runs (bench.app) and hands the Scheduler each
step's success reply in turn, as an agent's reply in its own process would: the one-statement
submission, then one statement per step. No worker, no broker (the messages go to Celery's
in-memory transport) and no Supervisor — only the statements of the hot path, so that the figure
is the database's and the noise of a whole stack is left out. With 1, 2, 4… clients at once it
shows what concurrency adds to each statement's cost on the same machine.

Prints, for each number of clients, PostgreSQL's CPU per step (every ``postgres`` process, read as
bench.cpu reads it), the clients' own CPU per step (the Scheduler's Python side with its store
calls), and steps a second; writes ``bench/results/hot_path-<date>.json`` with the median of the
repetitions. Usage:

    python -m bench.hot_path [--clients 1,2,4,8] [--runs 3000] [--repeat 3] [--postgres URL]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from datetime import date
from typing import Any

from bench.cpu import CpuMeter, cpu_seconds, named
from bench.throughput import REPO, fresh_database, machine, postgres_arguments, record
from sas_app.store.migrate import migrate

WORKFLOW = ("noop3", ("one", "two", "three"))
WARM_RUNS = 30


def _client(index: int, runs: int, go: Any, done: Any, finish: Any) -> None:
    """One client: warm up (its connection, its prepared statements), wait for ``go``, run its
    share, report its CPU, and stay (with its connection) until the parent has read PostgreSQL's."""
    from bench.app import sas

    def run(count: int, tag: str) -> None:
        workflow, names = WORKFLOW
        for i in range(count):
            handle = sas.submit(workflow, {}, business_key=f"{tag}-{index}-{i}")
            results: dict[str, Any] = {}
            for position, name in enumerate(names):
                sas.scheduler.step_done(handle.id, position, 1, {}, results=dict(results), workflow=workflow)
                results[name] = {}

    run(WARM_RUNS, "warm")
    done.put(0.0)
    go.wait()
    before = cpu_seconds(os.getpid())
    run(runs, "load")
    done.put(cpu_seconds(os.getpid()) - before)
    finish.wait()
    sas.store.dispose()


def level(clients: int, runs: int, admin_url: str) -> dict[str, float]:
    """``runs`` runs shared between ``clients`` processes at once, on a fresh database: per step,
    PostgreSQL's CPU and the clients', and steps a second."""
    os.environ["SAS_DATABASE_URL"] = url = fresh_database(admin_url, "sas_bench_hot_path")
    migrate(url)
    assert "bench.app" not in sys.modules, "imported here, the clients would keep the first level's database"
    context = multiprocessing.get_context("fork")
    go, finish, done = context.Event(), context.Event(), context.Queue()
    share = max(runs // clients, 1)
    procs = [context.Process(target=_client, args=(i, share, go, done, finish)) for i in range(clients)]
    steps = share * clients * len(WORKFLOW[1])
    postgres = CpuMeter({"postgres": named("postgres")}, reaping=["postgres"])
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            done.get(timeout=120)
        postgres.start()
        started = time.perf_counter()
        go.set()
        client_cpu = sum(done.get(timeout=600) for _ in procs)
        elapsed = time.perf_counter() - started
        spent_ms = postgres.per_step(steps)["cpu_postgres_ms"]  # before the clients' backends end
    finally:
        finish.set()
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return {"postgres_ms_per_step": spent_ms, "client_ms_per_step": 1000 * client_cpu / steps,
            "steps_per_s": steps / elapsed}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,2,4,8", help="numbers of clients at once, one level each")
    parser.add_argument("--runs", type=int, default=3000, help="runs a level, shared between its clients")
    parser.add_argument("--repeat", type=int, default=3)
    postgres_arguments(parser)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.clients.split(",")]
    with tempfile.TemporaryDirectory() as home:
        # each client imports the bench's app once forked, from this environment
        os.environ.update({"SAS_BROKER_URL": "memory://", "SAS_HOME": home, "SAS_TASK_EVENTS": "false"})
        sys.path.insert(0, str(REPO))
        print(f"{args.runs} runs a level, {args.repeat} repetitions, levels in turn", flush=True)
        taken: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
        for rep in range(args.repeat):
            for n in counts:
                figures = level(n, args.runs, args.postgres)
                taken[n].append(figures)
                print(f"  {n} clients, rep {rep + 1}: PostgreSQL {figures['postgres_ms_per_step']:.3f} ms a step, "
                      f"clients {figures['client_ms_per_step']:.3f} ms, {figures['steps_per_s']:.0f} steps/s",
                      flush=True)
    levels = [{"clients": n, "repetitions": taken[n],
               **{key: round(statistics.median(f[key] for f in taken[n]), 3) for key in taken[n][0]}}
              for n in counts]
    print(f"{'clients':>8} {'PostgreSQL ms/step':>19} {'clients ms/step':>16} {'steps/s':>8}")
    for row in levels:
        print(f"{row['clients']:>8} {row['postgres_ms_per_step']:>19.3f} {row['client_ms_per_step']:>16.3f} "
              f"{row['steps_per_s']:>8.0f}")
    result = {"date": date.today().isoformat(), "machine": machine(),
              "command": "python -m bench.hot_path " + " ".join(argv if argv is not None else sys.argv[1:]),
              "runs": args.runs, "repeat": args.repeat, "levels": levels}
    record(args.out, "hot_path", result)
    return result


if __name__ == "__main__":
    main()
