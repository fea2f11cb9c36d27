"""The Supervisor's sweep against table size, and recovery latency with the default interval.

1. Sweep cost: tables of 10k, 100k and 1M step rows (1% of them running past complete-by,
   inserted directly) beside ``--waiting`` (100k) runs waiting in the store — half asleep, half
   waiting for an event, 1% of them due — and the real sweep code recovering one batch of
   ``--batch`` expired steps and asking about one batch of due waits. The goal: the 1M-row batch
   within 2x of the 10k-row batch (the cost follows the rows that are due, not the table). Also
   timed: the dashboard's count of waiting runs (``sas_runs_waiting``) over those 100k.
2. Recovery latency: real worker and beat processes with the default sweep interval; each run's
   only step stays silent on its first attempt (as if its agent died); latency is from that
   attempt's complete-by to the second attempt's dispatch. Goal: p99 <= interval + 1 s.

Writes ``bench/results/sweep-<date>.json``. Usage: ``python -m bench.sweep [--sizes 10000,100000,1000000]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import date
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.throughput import REPO, bench_stack, fresh_database, machine, percentile, record, service_arguments
from sas_app.testing.processes import Processes, stopped_by_signals

FILL = """
INSERT INTO runs (id, workflow, business_key, payload, process_state, failure_count, priority, created_at, updated_at)
SELECT md5(i::text), 'bench', 'k' || i, '{}'::jsonb,
       CASE WHEN i % 100 = 0 THEN 'processing' ELSE 'processed' END, 0, 5, 0, 0
FROM generate_series(1, :n) AS i;
INSERT INTO steps (run_id, position, name, agent, action, state, attempt, complete_by, timeout, max_failures,
                   failure_count, idempotency_key, created_at, updated_at)
SELECT md5(i::text), 0, 'one', 'noop', 'work', CASE WHEN i % 100 = 0 THEN 'running' ELSE 'completed' END, 1,
       extract(epoch from now()) - 60, 30, 3, 0, md5(i::text) || '-one', 0, 0
FROM generate_series(1, :n) AS i;
"""
# runs waiting in the store: even ones asleep, odd ones waiting for an event; 1% due (their time past)
WAITING = """
INSERT INTO runs (id, workflow, business_key, payload, process_state, failure_count, priority, created_at, updated_at)
SELECT md5('w' || i), 'bench_wait', 'w' || i, '{}'::jsonb, 'processing', 0, 5, 0, 0
FROM generate_series(1, :w) AS i;
INSERT INTO steps (run_id, position, name, agent, action, state, attempt, not_before, complete_by, timeout,
                   max_failures, failure_count, idempotency_key, sleep, event, on_timeout, created_at, updated_at)
SELECT md5('w' || i), 0, 'wait', '', '', 'pending', 0, t, t, 3600, 1, 0, md5('w' || i) || '-wait',
       CASE WHEN i % 2 = 0 THEN 3600 END, CASE WHEN i % 2 = 1 THEN 'approval' END,
       CASE WHEN i % 2 = 1 THEN 'compensate' END, 0, 0
FROM (SELECT i, extract(epoch from now()) + CASE WHEN i % 100 = 0 THEN -60 ELSE 3600 END AS t
      FROM generate_series(1, :w) AS i) AS w;
"""


def sweep_cost(args: argparse.Namespace) -> list[dict[str, Any]]:
    from sas_app import SasApp, Settings, migrate
    from sas_app.store.observe import Observer

    out = []
    for size in args.sizes:
        url = fresh_database(args.postgres, "sas_bench_sweep")
        migrate(url)
        app = SasApp(Settings(database_url=url, broker_url="memory://localhost/", sweep_batch=args.batch,
                              home=Path("/tmp/sas-bench/sweep"), task_events=False))
        started = time.monotonic()
        with app.store.engine.begin() as conn:
            for statement in filter(str.strip, (FILL + WAITING).split(";")):
                conn.execute(text(statement), {"n": size, "w": args.waiting})
        with app.store.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
        filled = time.monotonic() - started
        timings = []
        for _ in range(args.samples):
            report = app.supervisor.sweep_once()
            timings.append(report.seconds)
            assert len(report.retried) == args.batch, "every batch recovers a full batch of expired steps"
            assert len(report.requeued) == args.batch, "and asks about a full batch of due waits"
        counted = time.perf_counter()
        waiting = dict(Observer(app.store).waiting_by_kind())
        count_ms = 1000 * (time.perf_counter() - counted)
        assert waiting.get("sleep", 0) + waiting.get("event", 0) == args.waiting
        out.append({"rows": size, "expired": size // 100, "waiting": args.waiting, "waits_due": args.waiting // 100,
                    "fill_s": round(filled, 1), "batch": args.batch,
                    "batch_ms_median": round(1000 * statistics.median(timings), 2),
                    "batch_ms_min": round(1000 * min(timings), 2), "batch_ms_max": round(1000 * max(timings), 2),
                    "waiting_count_ms": round(count_ms, 1)})
        print(f"  {size:>9} rows (+{args.waiting} waiting): one batch of {args.batch} expired and {args.batch} "
              f"due waits in {out[-1]['batch_ms_median']} ms; waiting runs counted in {count_ms:.0f} ms", flush=True)
        app.store.dispose()
    return out


def recovery_latency(args: argparse.Namespace) -> dict[str, Any]:
    from sqlalchemy import select

    logs = Path(os.environ.get("BENCH_LOGS", "/tmp/sas-bench")) / "sweep-recovery"
    env = bench_stack(args, "sweep_recovery", logs)
    from bench.app import sas
    from sas_app.store.tables import events

    sas.migrate()
    procs = Processes(logs, env, cwd=REPO)
    try:
        procs.worker("scheduler", "sas.scheduler,sas.supervisor", 2)
        procs.worker("agent", "sas.agent.noop", 2)
        procs.beat("beat")
        handles = []
        for i in range(args.recoveries):
            handles.append(sas.submit("recover", {}, business_key=f"rec-{i}"))
            time.sleep(args.spread)  # spread the expiries over the sweep interval
        for handle in handles:
            handle.wait(120)
        latencies = []
        with sas.store.engine.connect() as conn:
            for handle in handles:
                rows = conn.execute(select(events.c.attempt, events.c.to_state, events.c.at, events.c.detail)
                                    .where(events.c.run_id == handle.id, events.c.position == 0,
                                           events.c.to_state == "running")).all()
                first = next(r for r in rows if r.attempt == 1)
                second = next(r for r in rows if r.attempt == 2)
                latencies.append(second.at - first.detail["complete_by"])
    finally:
        procs.stop_all(grace=20)
        sas.store.dispose()
    interval = sas.settings.supervisor_interval
    return {"runs": len(latencies), "sweep_interval_s": interval, "retry_backoff_s": sas.settings.retry_backoff,
            "p50_s": round(percentile(latencies, 50), 3), "p99_s": round(percentile(latencies, 99), 3),
            "max_s": round(max(latencies), 3), "goal_p99_s": interval + 1}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--waiting", type=int, default=100_000, help="runs waiting in the store (sleeps, events)")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--recoveries", type=int, default=40)
    parser.add_argument("--spread", type=float, default=0.25, help="seconds between the recovery runs' submits")
    service_arguments(parser, redis_db=13)
    args = parser.parse_args(argv)

    print("sweep cost by table size", flush=True)
    cost = sweep_cost(args)
    print("recovery latency with the default sweep interval", flush=True)
    recovery = recovery_latency(args)
    smallest, largest = cost[0]["batch_ms_median"], cost[-1]["batch_ms_median"]
    result = {"date": date.today().isoformat(), "machine": machine(), "sweep": cost,
              "ratio_largest_over_smallest": round(largest / smallest, 2), "recovery": recovery}
    print(json.dumps({"ratio_largest_over_smallest": result["ratio_largest_over_smallest"], "recovery": recovery}))
    record(args.out, "sweep", result)
    return result


if __name__ == "__main__":
    with stopped_by_signals():  # Ctrl-C or SIGTERM: the bench's own finally stops every process it started
        main()
