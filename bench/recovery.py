"""Recovery at scale: a fleet of agent workers dies with ``--in-flight`` (10,000) steps running,
in a store of ``--rows`` (1M) step rows, and the Supervisor gets every one of them going again.

1. The store is filled with finished runs of the one-step ``noop1`` workflow (inserted directly),
   up to ``--rows`` step rows with the runs below.
2. Real worker and beat processes, default settings (sweep interval, batch, back-off): the
   in-flight runs are submitted in bulk and the Scheduler dispatches their step; no agent worker
   consumes them yet.
3. The agents "die": their queue is purged (the messages were lost with them) and every one of
   those steps is given the same complete-by, ``--lead`` seconds ahead — the worst case, all due
   in the same instant. An agent worker is started (the fleet comes back).
4. Measured: for each step, from that complete-by to its second attempt's dispatch (the event
   the Scheduler records), p50, p99 and max; then until every run has ended.

Goal: every step re-dispatched within 15 s of its complete-by. Writes
``bench/results/recovery-<date>.json``. Usage: ``python -m bench.recovery [--in-flight 10000] [--rows 1000000]``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import date
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text, update

from bench.throughput import REPO, bench_stack, machine, percentile, record, service_arguments
from sas_app import Submission
from sas_app.testing.processes import Processes, stopped_by_signals

# finished runs of noop1, one step row each: what a store holds after a while
FILL = """
INSERT INTO runs (id, workflow, business_key, payload, process_state, failure_count, priority, created_at, updated_at)
SELECT md5(i::text), 'noop1', 'old-' || i, '{}'::jsonb, 'processed', 0, 5, 0, 0 FROM generate_series(1, :n) AS i;
INSERT INTO steps (run_id, position, name, agent, action, state, attempt, timeout, max_failures, failure_count,
                   idempotency_key, created_at, updated_at)
SELECT md5(i::text), 0, 'one', 'noop', 'work', 'completed', 1, 30, 3, 0, md5(i::text) || '-one', 0, 0
FROM generate_series(1, :n) AS i;
"""
GOAL_S = 15.0


def wait_for(count: Any, target: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while (seen := count()) < target:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {seen} of {target} after {timeout:.0f} s")
        time.sleep(0.25)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in-flight", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=1_000_000, help="step rows in the store, the in-flight included")
    parser.add_argument("--lead", type=float, default=3.0, help="seconds from the agents' death to the complete-by")
    parser.add_argument("--timeout", type=float, default=300.0)
    service_arguments(parser, redis_db=13)
    args = parser.parse_args(argv)

    logs = Path(os.environ.get("BENCH_LOGS", "/tmp/sas-bench/recovery"))
    env = bench_stack(args, "recovery", logs)
    from bench.app import sas  # after the environment names the stack
    from sas_app.messaging.routing import agent_queue
    from sas_app.store.connection import db_now
    from sas_app.store.tables import events, runs, steps

    sas.migrate()
    started = time.monotonic()
    with sas.store.engine.begin() as conn:
        for statement in filter(str.strip, FILL.split(";")):
            conn.execute(text(statement), {"n": max(args.rows - args.in_flight, 0)})
    with sas.store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    print(f"store filled with {args.rows - args.in_flight} finished runs in {time.monotonic() - started:.0f} s",
          flush=True)

    ours = runs.c.business_key.like("fly-%")
    procs = Processes(logs, env, cwd=REPO)
    try:
        procs.worker("scheduler", "sas.scheduler,sas.supervisor", 2)
        procs.beat("beat")
        keys = [f"fly-{i}" for i in range(args.in_flight)]
        for at in range(0, len(keys), 1000):
            sas.submit_many([Submission("noop1", {}, key) for key in keys[at:at + 1000]])
        running = select(func.count()).select_from(steps.join(runs, runs.c.id == steps.c.run_id)).where(
            ours, steps.c.state == "running", steps.c.attempt == 1)

        def count(query: Any) -> int:
            with sas.store.engine.connect() as conn:
                return int(conn.execute(query).scalar_one())

        wait_for(lambda: count(running), args.in_flight, args.timeout, "steps dispatched")
        # the agents die: their messages go with them, and every step falls due in the same instant
        with sas.celery.connection_for_write() as conn:
            lost = conn.default_channel.queue_purge(agent_queue("noop"))
        with sas.store.engine.begin() as conn:
            due = float(conn.execute(select(db_now())).scalar_one()) + args.lead
            conn.execute(update(steps).where(steps.c.run_id.in_(select(runs.c.id).where(ours)))
                         .values(complete_by=due))
        print(f"{args.in_flight} steps in flight; {lost} agent messages lost; all due in {args.lead:g} s", flush=True)
        procs.worker("agent", "sas.agent.noop", 2)
        second = (select(events.c.at).select_from(events.join(runs, runs.c.id == events.c.run_id))
                  .where(ours, events.c.to_state == "running", events.c.attempt == 2))
        wait_for(lambda: count(select(func.count()).select_from(second.subquery())), args.in_flight, args.timeout,
                 "steps re-dispatched")
        with sas.store.engine.connect() as conn:
            latencies = [at - due for (at,) in conn.execute(second)]
        wait_for(lambda: count(select(func.count()).where(ours, runs.c.process_state == "processed")),
                 args.in_flight, args.timeout, "runs processed")
        with sas.store.engine.connect() as conn:
            ended = float(conn.execute(select(func.max(runs.c.updated_at)).where(ours)).scalar_one()) - due
            total = int(conn.execute(select(func.count()).select_from(steps)).scalar_one())
    finally:
        procs.stop_all(grace=20)
        sas.store.dispose()
    s = sas.settings
    result = {"date": date.today().isoformat(), "machine": machine(), "in_flight": args.in_flight,
              "step_rows": total, "sweep_interval_s": s.supervisor_interval, "sweep_batch": s.sweep_batch,
              "retry_backoff_s": s.retry_backoff,
              "redispatch_p50_s": round(percentile(latencies, 50), 2),
              "redispatch_p99_s": round(percentile(latencies, 99), 2),
              "redispatch_max_s": round(max(latencies), 2), "all_processed_s": round(ended, 2), "goal_max_s": GOAL_S}
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}), flush=True)
    record(args.out, "recovery", result)
    return result


if __name__ == "__main__":
    with stopped_by_signals():  # Ctrl-C or SIGTERM: the bench's own finally stops every process it started
        main()
