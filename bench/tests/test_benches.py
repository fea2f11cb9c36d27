"""The benchmark scripts run end to end in a tiny configuration, so they cannot rot. The figures
themselves are not asserted here: they belong to bench/results."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench
#: a bench's stack takes fixed database names (sas_bench_<bench>): two tests of one bench run one at a
#: time; beside other tests, so their figures here mean nothing
one_bench = pytest.mark.one_bench
REPO = Path(__file__).resolve().parents[2]


#: the benches' stacks sweep every second here, not every 5 s: these tests check that a bench runs
#: and reports, not its figures
QUICK_SWEEPS = {"SAS_SUPERVISOR_INTERVAL": "1"}


def own_redis() -> list[str]:
    """A Redis number of this pytest-xdist worker's own among the benches' (12-15, which the
    integration tests leave them), so two benches can run at once."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
    return ["--redis", os.environ.get("SAS_TEST_REDIS", "redis://127.0.0.1:6379") + f"/{12 + worker % 4}"]


def run_bench(module: str, *args: str, tmp_path, env: dict[str, str] | None = None, redis: bool = True) -> dict:
    args = (*args, *own_redis()) if redis else args
    done = subprocess.run([sys.executable, "-m", module, *args, "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "BENCH_LOGS": str(tmp_path / "logs"), **(env or {})})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [written] = tmp_path.glob(f"{module.split('.')[-1]}-*.json")
    return json.loads(written.read_text())


@one_bench("throughput")
def test_throughput_bench_runs_every_contender(tmp_path):
    # enough runs that each component's share is measurable (bench/cpu.py reads the scheduler's
    # nanoseconds; with 5 runs a clock tick's count read 0 for PostgreSQL)
    result = run_bench("bench.throughput", "--runs", "40", "--repeat", "1", "--idle-runs", "2",
                       "--concurrency", "2", tmp_path=tmp_path)
    assert {"sas_app", "celery_chain", "dbos", "ratio_sas_over_celery", "ratio_sas_over_dbos"} <= set(result)
    [ours], [chain] = result["repetitions"]["sas_app"], result["repetitions"]["celery_chain"]  # one turn each
    assert result["paired_sas_over_celery"]["median"] == round(ours["steps_per_s"] / chain["steps_per_s"], 3)
    assert result["sas_app"]["steps_per_s"]["median"] > 0
    # where the CPU went, per step, each component of the stack and the submitter
    parts = {"agent_main", "agent_pool", "scheduler_main", "scheduler_pool", "beat", "postgres", "broker", "submitter"}
    assert {f"cpu_{part}_ms" for part in parts} <= set(result["sas_app"])
    assert result["sas_app"]["cpu_agent_pool_ms"]["median"] > 0 and result["sas_app"]["cpu_postgres_ms"]["median"] > 0
    assert result["celery_chain"]["cpu_total_ms"]["median"] > 0
    assert result["machine"]["cores"] >= 1


@one_bench("throughput")
def test_throughput_bench_submits_in_bulk_with_task_events_through_pgbouncer_and_counts_commits_and_messages(
        tmp_path):
    result = run_bench("bench.throughput", "--runs", "6", "--repeat", "1", "--idle-runs", "1", "--concurrency", "2",
                       "--skip-dbos", "--bulk", "3", "--task-events", "--pgbouncer", tmp_path=tmp_path)
    assert (result["bulk"], result["task_events"], result["pgbouncer"]) == (3, True, True)
    sas = result["sas_app"]
    assert "cpu_pooler_ms" in sas
    # a run's first step is published; the two after it run on the worker that completed the one
    # before (the same agent's: no message)
    assert sas["messages_per_step"]["median"] >= 1 / 3 and sas["commits_per_step"]["median"] >= 1
    assert sas["submit_per_s"]["median"] > 0


def test_throughput_bench_refuses_a_count_below_one_before_it_starts_anything():
    done = subprocess.run([sys.executable, "-m", "bench.throughput", "--idle-runs", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--idle-runs must be at least 1 (got 0)" in done.stderr


@one_bench("hot_path")
def test_hot_path_bench_measures_postgresql_a_step_at_each_number_of_clients(tmp_path):
    result = run_bench("bench.hot_path", "--clients", "1,2", "--runs", "20", "--repeat", "1", tmp_path=tmp_path,
                       redis=False)
    assert [row["clients"] for row in result["levels"]] == [1, 2]
    assert all(row["postgres_ms_per_step"] > 0 and row["client_ms_per_step"] > 0 and row["steps_per_s"] > 0
               for row in result["levels"])


@one_bench("statement")
def test_statement_bench_takes_a_reply_s_statement_apart(tmp_path):
    result = run_bench("bench.statement", "--runs", "5", "--repeat", "1", tmp_path=tmp_path, redis=False)
    ways = {"as_sent", "with_notifications", "no_flush_wait", "psycopg3", "one_row_update",
            "two_updates_two_inserts"}
    assert set(result["ms_per_statement"]) == ways
    assert all(value > 0 for value in result["ms_per_statement"].values())


@one_bench("sweep")
def test_sweep_bench_measures_cost_and_recovery(tmp_path):
    result = run_bench("bench.sweep", "--sizes", "2000,4000", "--waiting", "2000", "--samples", "1",
                       "--recoveries", "2", "--spread", "0", tmp_path=tmp_path, env=QUICK_SWEEPS)
    assert [row["rows"] for row in result["sweep"]] == [2000, 4000]
    assert result["recovery"]["runs"] == 2


@one_bench("recovery")
def test_recovery_bench_gets_a_dead_fleets_steps_going_again(tmp_path):
    result = run_bench("bench.recovery", "--in-flight", "40", "--rows", "2000", "--lead", "1", tmp_path=tmp_path,
                       env=QUICK_SWEEPS)
    assert (result["in_flight"], result["step_rows"]) == (40, 2000)
    assert 0 < result["redispatch_p50_s"] <= result["redispatch_max_s"] <= result["all_processed_s"]


@one_bench("dashboard")
def test_dashboard_bench_times_every_page_and_catches_up_the_metrics(tmp_path):
    result = run_bench("bench.dashboard", "--sizes", "3000", "--samples", "1", tmp_path=tmp_path, redis=False)
    [size] = result["sizes"]
    assert len(size["pages"]) == 8 and all(page["ms_median"] > 0 for page in size["pages"].values())
    assert size["metrics_caught_up_after_scrapes"] is not None and size["metrics_steps_counted"] == 3000
    restarted = size["metrics_restarted"]  # from the first dashboard's checkpoint, past every event
    assert restarted["resumed_after_event"] == size["events"] and restarted["caught_up"]
    assert restarted["steps_counted"] == 3000


@one_bench("backpressure")
def test_backpressure_bench_overloads_an_agent_and_loses_nothing(tmp_path):
    result = run_bench("bench.backpressure", "--depth", "3", "--timeout", "1", "--service", "0.05",
                       "--concurrency", "2", "--only-paced", "--bound", "120", tmp_path=tmp_path)
    paced = result["paced"]
    assert paced["runs"] == 120 and paced["lost"] == 0 and paced["ended_within_bound"]
    assert sum(paced["states"].values()) == 120 and paced["messages_per_step"] >= 1
    assert paced["series"] and paced["depth_max"] > 0


def test_kit_bench_times_the_examples_and_the_kit_s_own_tests(tmp_path):
    # the unit tier's timing left out: the suite runs that tier already, and it costs a minute of both cores
    result = run_bench("bench.kit", "--no-unit-tier", tmp_path=tmp_path, redis=False)
    assert result["tests"] == len(result["by_test_ms"]) >= 10
    assert set(result["by_file_s"]) == {f"examples.test_{name}" for name in ("approval", "fanout", "refund", "signup")
                                        } | {"tests.unit.test_testing_kit"}
    assert result["unit_tier"] is None


@one_bench("async")
def test_async_bench_runs_async_actions_plain_actions_and_a_chain_against_a_slow_service(tmp_path):
    result = run_bench("bench.async_agents", "--runs", "12", "--threads", "12", "--processes", "2",
                       "--service-ms", "50", tmp_path=tmp_path)
    for name in ("sas_app_async_threads", "sas_app_plain_prefork", "celery_chain_prefork"):
        assert result[name]["steps_per_s"] > 0 and result[name]["agent_rss_mb"] > 0, result


@one_bench("api")
def test_api_bench_times_submit_and_get_run_over_http_beside_python(tmp_path):
    result = run_bench("bench.api", "--requests", "40", "--clients", "2", "--threads", "4", tmp_path=tmp_path)
    for name in ("python_submit", "api_submit", "python_get_run", "api_get_run"):
        assert 0 < result[name]["p50_ms"] <= result[name]["p99_ms"], result
    assert result["api_submit_at_once_per_s"] > 0 and result["python_submit_at_once_per_s"] > 0


@one_bench("rate_limit")
def test_rate_limit_bench_counts_what_the_service_saw_from_every_worker(tmp_path):
    result = run_bench("bench.rate_limit", "--runs", "30", "--limit", "15", "--workers", "2", "--concurrency", "2",
                       "--brokers", "redis", tmp_path=tmp_path)
    seen = result["redis"]
    assert seen["calls"] == 30 and sum(seen["per_second"]) == 30, seen
    assert {"rate", "steady_rate", "most_in_any_second", "longest_over_limit_s", "deferred"} <= set(seen)


def test_the_slow_link_holds_each_round_trip_and_passes_what_is_said():
    # --db-latency's relay: a query through it answers as PostgreSQL does, a round trip later
    import psycopg2
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.pool import NullPool

    from bench.slow_link import slow_link

    server = make_url(os.environ["SAS_TEST_POSTGRES"])
    with slow_link(server.host or "127.0.0.1", server.port or 5432, 40) as port:
        engine = create_engine(server.set(host="127.0.0.1", port=port), poolclass=NullPool)
        left_open = engine.raw_connection()  # the relay closes it when it stops
        try:
            with engine.connect() as conn:
                started = time.perf_counter()
                assert conn.execute(text("SELECT 'through'")).scalar_one() == "through"
                took = time.perf_counter() - started
        finally:
            engine.dispose()
    assert took >= 0.04
    with pytest.raises(psycopg2.Error):
        left_open.cursor().execute("SELECT 1")
    left_open.invalidate()
    gc.collect()  # nothing of the relay left to finalise later, in another test
