"""DBOS Transact, three @DBOS.step()s per workflow started through a DBOS queue, on the same
PostgreSQL server. Run as its own process (DBOS keeps process-wide state); prints one JSON line."""

from __future__ import annotations

import argparse
import json
import time

from dbos import DBOS, DBOSConfig


@DBOS.step()
def step(i: int) -> int:
    return i


@DBOS.workflow()
def three_steps(i: int) -> float:
    step(i)
    step(i)
    step(i)
    return time.time()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    config: DBOSConfig = {"name": "sas-bench", "system_database_url": args.database_url}
    DBOS(config=config)
    DBOS.launch()
    queue = DBOS.register_queue("bench", worker_concurrency=args.concurrency, polling_interval_sec=0.01)
    started = time.time()
    handles = [(time.time(), queue.enqueue(three_steps, i)) for i in range(args.runs)]
    latencies = [handle.get_result() - submitted for submitted, handle in handles]
    elapsed = time.time() - started
    DBOS.destroy()
    print(json.dumps({"elapsed": elapsed, "latencies": latencies}))


if __name__ == "__main__":
    main()
