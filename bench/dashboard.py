"""The dashboard's pages and the metrics scrape against the size of the store.

Stores of 100k and 1M runs on PostgreSQL (inserted directly: 96% processed, 2% processing, 1% error,
1% compensated, over two workflows and the last 24 hours; one step and three events a run), then
each page the dashboard serves timed through its WSGI application (no network), several times
each. The metrics scrapes catch up at most ``MAX_BATCHES`` x ``BATCH`` events of history each
(counters are left out until they hold it all); a later scrape reads only what is new. Goal:
every page and a steady scrape well under a second at 1M runs, and no catch-up scrape near
Prometheus's default 10 s timeout.

Writes ``bench/results/dashboard-<date>.json``. Usage: ``python -m bench.dashboard [--sizes 100000,1000000]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import date
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.throughput import RESULTS, fresh_database, machine, record

FILL = """
INSERT INTO runs (id, workflow, business_key, payload, process_state, failure_count, priority, created_at, updated_at)
SELECT md5(i::text), CASE WHEN i % 3 = 0 THEN 'signup' ELSE 'order' END, 'k' || i, '{}'::jsonb,
       CASE WHEN i % 100 = 1 THEN 'error' WHEN i % 100 = 2 THEN 'compensated'
            WHEN i % 100 IN (3, 4) THEN 'processing' ELSE 'processed' END,
       0, 5, :now - 86400 + 86400.0 * i / :n, :now - 86400 + 86400.0 * i / :n
FROM generate_series(1, :n) AS i;
INSERT INTO steps (run_id, position, name, agent, action, state, attempt, complete_by, timeout, max_failures,
                   failure_count, idempotency_key, created_at, updated_at, completed_at)
SELECT md5(i::text), 0, 'one', 'svc', 'work', 'completed', 1, :now - 86400 + 86400.0 * i / :n + 30, 30, 3, 0,
       md5(i::text) || '-one', 0, 0, :now - 86400 + 86400.0 * i / :n + 0.2
FROM generate_series(1, :n) AS i;
INSERT INTO events (run_id, position, kind, from_state, to_state, attempt, actor, at, detail)
SELECT md5(i::text), p.position, 'transition', p.from_state, p.to_state, p.attempt, 'bench',
       :now - 86400 + 86400.0 * i / :n + p.offset_s, NULL
FROM generate_series(1, :n) AS i,
     (VALUES (NULL::int, NULL::text, 'pending', NULL::int, 0.0), (0, 'not_started', 'running', 1, 0.01),
             (0, 'running', 'completed', 1, 0.2)) AS p(position, from_state, to_state, attempt, offset_s);
INSERT INTO alerts (dedup_key, run_id, position, kind, attempt, reason, at)
SELECT 'failed:' || md5(i::text), md5(i::text), 0, 'failed', 1, 'refused', :now - 86400 + 86400.0 * i / :n
FROM generate_series(1, :n) AS i WHERE i % 100 = 1;
"""

PAGES = ["/", "/?window=86400", "/runs", "/runs?state=error", "/runs?workflow=signup&state=compensated",
         "/runs?key=k4242", "/runs/{run_id}", "/alerts"]


def timed(client: Any, path: str, samples: int) -> dict[str, float]:
    seconds = []
    for _ in range(samples):
        started = time.perf_counter()
        response = client.get(path)
        seconds.append(time.perf_counter() - started)
        assert response.status_code == 200, (path, response.status_code)
    return {"ms_median": round(1000 * statistics.median(seconds), 1), "ms_max": round(1000 * max(seconds), 1)}


def measure(args: argparse.Namespace, size: int) -> dict[str, Any]:
    from sas_app import SasApp, Settings, migrate
    from sas_app.web.dashboard import create_dashboard
    from sas_app.web.metrics import CHECKPOINT

    url = fresh_database(args.postgres, "sas_bench_dashboard")
    migrate(url)
    app = SasApp(Settings(database_url=url, broker_url="memory://localhost/", home=Path("/tmp/sas-bench/dashboard"),
                          task_events=False))
    started = time.monotonic()
    with app.store.engine.begin() as conn:
        for statement in filter(str.strip, FILL.split(";")):
            conn.execute(text(statement), {"n": size, "now": time.time() - 10})  # all past the margin
    with app.store.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    filled = time.monotonic() - started
    client = create_dashboard(app).test_client()
    pages = {}
    for page in PAGES:
        path = page.format(run_id=_md5(size // 2))
        pages[path] = timed(client, path, args.samples)
        print(f"  {size:>8} runs: {path:<42} {pages[path]['ms_median']:>8} ms", flush=True)
    scrapes: list[float] = []
    caught_up_after = None
    while len(scrapes) < args.scrapes:  # until the counters hold the whole history, then one more
        started = time.perf_counter()
        body = client.get("/metrics").get_data(as_text=True)
        scrapes.append(round(1000 * (time.perf_counter() - started), 1))
        if "sas_metrics_caught_up 1.0" in body:
            if caught_up_after is not None:
                break
            caught_up_after = len(scrapes)
    counted = steps_counted(body)
    print(f"  {size:>8} runs: /metrics scrapes (ms) {scrapes}; caught up after {caught_up_after} scrapes, "
          f"step durations counted {counted}", flush=True)
    # a dashboard restarted over the same history resumes from the counters' checkpoint
    saved = app.store.checkpoint(CHECKPOINT)
    started = time.perf_counter()
    body = create_dashboard(app).test_client().get("/metrics").get_data(as_text=True)
    restarted = {"first_scrape_ms": round(1000 * (time.perf_counter() - started), 1),
                 "caught_up": "sas_metrics_caught_up 1.0" in body, "steps_counted": steps_counted(body),
                 "resumed_after_event": None if saved is None else saved[0]}
    print(f"  {size:>8} runs: restarted, first /metrics scrape {restarted['first_scrape_ms']} ms, caught up "
          f"{restarted['caught_up']}, step durations counted {restarted['steps_counted']}", flush=True)
    app.store.dispose()
    return {"runs": size, "events": 3 * size, "fill_s": round(filled, 1), "pages": pages,
            "metrics_scrapes_ms": scrapes, "metrics_caught_up_after_scrapes": caught_up_after,
            "metrics_steps_counted": counted, "metrics_restarted": restarted}


def steps_counted(body: str) -> float | None:
    return next((float(line.split()[-1]) for line in body.splitlines()
                 if line.startswith('sas_step_duration_seconds_count{agent="svc"}')), None)


def _md5(i: int) -> str:
    import hashlib

    return hashlib.md5(str(i).encode()).hexdigest()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=os.environ.get(
        "SAS_TEST_POSTGRES", "postgresql+psycopg2://postgres:postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100_000, 1_000_000])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=30, help="at most this many scrapes")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the folder to write dashboard-<date>.json in")
    args = parser.parse_args(argv)
    results = {"date": date.today().isoformat(), "machine": machine(),
               "sizes": [measure(args, size) for size in args.sizes]}
    record(args.out, "dashboard", results)
    return results


if __name__ == "__main__":
    main()
