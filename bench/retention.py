"""Retention on a large store: how fast ``sas purge`` deletes, and what it costs the hot path.

Fills a fresh PostgreSQL database with ``--runs`` (1M) finished runs — each with two steps and
six events, a tenth with an alert and an outbox row, as the straight-line workflow leaves them —
ended a day ago, then:

1. the throughput of the 3-step no-op workflow on real workers with nothing else running;
2. the same while ``purge`` deletes every old run in batches of ``--batch`` (its own thread);
3. the purge's own figures: runs and rows deleted per second, the longest batch.

Writes ``bench/results/retention-<date>.json``. Usage: ``python -m bench.retention [--runs 1000000]``
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import func, select, text

from bench.throughput import CHECKOUT_PATH, REPO, fresh_database, machine, record, service_arguments
from sas_app.testing.processes import Processes, stopped_by_signals

FILL = """
INSERT INTO runs (id, workflow, business_key, payload, process_state, failure_count, priority, linear,
                  depth, created_at, updated_at)
SELECT md5(i::text), 'old', 'old-' || i, '{}'::jsonb, 'processed', 0, 5, true, 0,
       extract(epoch from now()) - 86400 - i * 0.001, extract(epoch from now()) - 86400
FROM generate_series(1, :n) AS i;
INSERT INTO steps (run_id, position, name, agent, action, state, attempt, timeout, max_failures, failure_count,
                   idempotency_key, escalated, created_at, updated_at, completed_at)
SELECT md5(i::text), p, 'step' || p, 'noop', 'work', 'completed', 1, 30, 3, 0, md5(i::text) || '-' || p, 0, 0, 0, 0
FROM generate_series(1, :n) AS i, generate_series(0, 1) AS p;
INSERT INTO events (run_id, position, kind, from_state, to_state, attempt, actor, at)
SELECT md5(i::text), NULL, 'transition', 'pending', 'processing', NULL, 'bench', 0
FROM generate_series(1, :n) AS i, generate_series(1, 6) AS e;
INSERT INTO alerts (dedup_key, run_id, position, kind, attempt, reason, at)
SELECT 'failed:' || md5(i::text), md5(i::text), 0, 'failed', 1, 'old', 0
FROM generate_series(1, :n, 10) AS i;
INSERT INTO outbox (run_id, reply_to, body, created_at, sent_at)
SELECT md5(i::text), 'replies', '{}'::jsonb, 0, 0
FROM generate_series(1, :n, 10) AS i;
"""


def throughput(sas: Any, workflow: str, runs: int, prefix: str) -> float:
    from sas_app.store.tables import runs as runs_table

    started = time.time()
    for i in range(runs):
        sas.submit(workflow, {}, business_key=f"{prefix}-{i}")
    where = runs_table.c.business_key.like(f"{prefix}-%")
    with sas.store.engine.connect() as conn:
        deadline = time.monotonic() + 600
        while conn.execute(select(func.count()).where(where, runs_table.c.process_state == "processed")
                           ).scalar_one() < runs:
            if time.monotonic() > deadline:
                raise RuntimeError("the runs did not finish in time")
            time.sleep(0.2)
            conn.commit()
        last = conn.execute(select(func.max(runs_table.c.updated_at)).where(where)).scalar_one()
    return round(3 * runs / (last - started), 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1_000_000, help="old finished runs in the store")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--load", type=int, default=1500, help="runs submitted for each throughput figure")
    service_arguments(parser, redis_db=12)
    args = parser.parse_args(argv)

    db_url = fresh_database(args.postgres, "sas_bench_retention")
    redis.Redis.from_url(args.redis).flushdb()
    home = Path("/tmp/sas-bench/retention")
    env = {**os.environ, "SAS_APP": "bench.app:sas", "SAS_DATABASE_URL": db_url, "SAS_BROKER_URL": args.redis,
           "SAS_HOME": str(home / "home"), "SAS_TASK_EVENTS": "false", "PYTHONPATH": CHECKOUT_PATH}
    os.environ.update({k: env[k] for k in ("SAS_DATABASE_URL", "SAS_BROKER_URL", "SAS_HOME", "SAS_TASK_EVENTS")})
    from bench.app import sas
    from sas_app.interfaces.retention import purge

    sas.migrate()
    print(f"filling {args.runs} finished runs ...", flush=True)
    filled = time.monotonic()
    with sas.store.engine.begin() as conn:
        for statement in filter(str.strip, FILL.split(";")):
            conn.execute(text(statement), {"n": args.runs})
    with sas.store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
        rows_before = sum(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
                          for t in ("runs", "steps", "events", "alerts", "outbox"))
    print(f"  {rows_before} rows in {time.monotonic() - filled:.0f} s", flush=True)

    procs = Processes(home, env, cwd=REPO)
    result: dict[str, Any] = {}
    try:
        procs.worker("scheduler", "sas.scheduler,sas.supervisor", 4)
        procs.worker("agent", "sas.agent.noop", 4)
        throughput(sas, "noop3", 200, "warm")
        alone = throughput(sas, "noop3", args.load, "alone")
        print(f"hot path alone: {alone} steps/s", flush=True)
        batches: list[float] = []
        outcome: dict[str, Any] = {}

        def purging() -> None:
            started = time.perf_counter()
            total = rows = 0
            while True:
                t0 = time.perf_counter()
                deleted, deleted_rows = sas.store.purge_batch(3600, ["processed"], args.batch)
                batches.append(time.perf_counter() - t0)
                total, rows = total + deleted, rows + deleted_rows
                if deleted < args.batch:
                    break
            outcome.update(runs=total, rows=rows, seconds=time.perf_counter() - started)

        thread = threading.Thread(target=purging)
        thread.start()
        during = throughput(sas, "noop3", args.load, "during")
        print(f"hot path while purging: {during} steps/s", flush=True)
        thread.join()
        check = purge(sas.store, 3600, ["processed"])
        assert check.runs == 0, "every old run was deleted"
        result = {
            "date": date.today().isoformat(), "machine": machine(), "old_runs": args.runs, "rows": rows_before,
            "batch": args.batch, "purged_runs": outcome["runs"], "purged_rows": outcome["rows"],
            "purge_s": round(outcome["seconds"], 1),
            "runs_per_s": round(outcome["runs"] / outcome["seconds"]),
            "rows_per_s": round(outcome["rows"] / outcome["seconds"]),
            "batch_ms_median": round(1000 * sorted(batches)[len(batches) // 2], 1),
            "batch_ms_max": round(1000 * max(batches), 1),
            "hot_path_steps_per_s_alone": alone, "hot_path_steps_per_s_while_purging": during,
        }
        print(result, flush=True)
        record(args.out, "retention", result)
    finally:
        procs.stop_all(grace=20)
        sas.store.dispose()
    return result


if __name__ == "__main__":
    with stopped_by_signals():  # Ctrl-C or SIGTERM: the bench's own finally stops every process it started
        main()
