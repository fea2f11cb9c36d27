"""Throughput and latency of sas_app against a plain Celery chain and DBOS, side by side.

On real Redis (broker) and PostgreSQL (state), each contender runs N runs of a three-step
workflow whose steps do no remote work, on two worker processes of C slots each:

* sas_app end to end (submit → processed), with the Supervisor's beat running;
* the same three no-op tasks as a plain Celery ``chain`` on the same broker;
* DBOS Transact, three ``@DBOS.step``s per workflow started through a DBOS queue (2·C workers).

The contenders take turns, one repetition each (sas_app, the chain, DBOS, then again), on stacks
started once, so that a slow spell of the machine falls on all of them alike. Prints a table and
writes ``bench/results/throughput-<date>.json``: the median of the repetitions
with min-max, the ratios sas/celery and sas/dbos, the machine and the versions, and where the CPU
went per step for sas_app and the chain (:mod:`bench.cpu`: each worker's main process and pool,
beat, PostgreSQL, the broker, the submitting process). Usage:

    python -m bench.throughput [--runs 2000] [--repeat 3] [--concurrency 4] [--task-events] [--bulk N]
        [--pgbouncer] [--db-latency MS]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import date
from importlib.metadata import version
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from bench.cpu import CpuMeter, Pids, children, named, worker
from bench.slow_link import slow_link
from harness.pgbouncer import pgbouncer, through
from sas_app import Submission
from sas_app.testing.processes import CELERY_READY, Processes, stopped_by_signals

REPO = Path(__file__).resolve().parents[1]
#: what a process the benches start imports: this checkout's sas_app (src/), and its benches
CHECKOUT_PATH = os.pathsep.join([str(REPO / "src"), str(REPO)])
RESULTS = REPO / "bench" / "results"


def rss_mb(pid: int) -> float:
    """Resident memory of a worker: its main process and its pool children."""
    total = 0
    for p in [pid, *children(pid)]:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return round(total / 1024, 1)


def record(out: Path, name: str, result: dict[str, Any]) -> Path:
    """Write ``result`` as ``<out>/<name>-<date>.json`` (today unless it carries a date) and say
    where; the earlier files of ``name`` there are removed: a folder keeps the latest of each
    bench (git keeps the history)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{result.get('date', date.today().isoformat())}.json"
    for earlier in out.glob(f"{name}-[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9].json"):
        earlier.unlink()
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {path}", flush=True)
    return path


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def servers() -> dict[str, Pids]:
    """PostgreSQL's processes and the broker's (Redis or RabbitMQ), for the CPU breakdown: each
    counts its children that exit (:data:`SERVERS`)."""
    return {"postgres": named("postgres"), "broker": named("redis-server", "beam.smp")}


#: the components of :func:`servers`, whose exited processes their parents reaped (``CpuMeter``'s ``reaping``)
SERVERS = ("postgres", "broker")


def workers(**pids: int) -> dict[str, Pids]:
    """``name=pid`` of each Celery worker, as its main process and its pool."""
    return {f"{name}_{part}": found for name, pid in pids.items() for part, found in worker(pid).items()}


def traffic(store: Any, broker: str) -> dict[str, int]:
    """Counters read before and after the load: the transactions that wrote to PostgreSQL (the
    transaction ids it handed out, cluster-wide: a read-only transaction takes none) and the
    messages published to Redis (LPUSH calls)."""
    with store.engine.connect() as conn:
        writes = conn.exec_driver_sql("SELECT pg_current_xact_id()::text::bigint").scalar_one()
        conn.rollback()
    stats = redis.Redis.from_url(broker).info("commandstats") if broker.startswith("redis") else {}
    return {"commits": int(writes), "messages": int(stats.get("cmdstat_lpush", {}).get("calls", 0))}


def postgres_arguments(parser: argparse.ArgumentParser) -> None:
    """``--postgres`` (an admin URL: each bench makes its own database) and ``--out`` (the results
    folder): every bench takes them."""
    parser.add_argument("--postgres", default=os.environ.get("SAS_TEST_POSTGRES",
                                                             "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--out", type=Path, default=RESULTS)


def service_arguments(parser: argparse.ArgumentParser, redis_db: int) -> None:
    """:func:`postgres_arguments`, and ``--redis`` (database ``redis_db`` of the test Redis), for
    the benches that run a broker."""
    postgres_arguments(parser)
    parser.add_argument("--redis", default=os.environ.get("SAS_TEST_REDIS", "redis://127.0.0.1:6379") + f"/{redis_db}")


def fresh_database(admin_url: str, name: str) -> str:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def bench_stack(args: argparse.Namespace, name: str, logs: Path) -> dict[str, str]:
    """A bench's own stack: a fresh database ``sas_bench_<name>``, its Redis number emptied, and
    the environment its processes run in (the bench's app, no task events) — set in this process
    too, so that ``bench.app``, imported after, names the same stack."""
    db_url = fresh_database(args.postgres, f"sas_bench_{name}")
    redis.Redis.from_url(args.redis).flushdb()
    env = {**os.environ, "SAS_APP": "bench.app:sas", "SAS_DATABASE_URL": db_url, "SAS_BROKER_URL": args.redis,
           "SAS_HOME": str(logs / "home"), "SAS_TASK_EVENTS": "false", "PYTHONPATH": CHECKOUT_PATH}
    os.environ.update({k: env[k] for k in ("SAS_DATABASE_URL", "SAS_BROKER_URL", "SAS_HOME", "SAS_TASK_EVENTS")})
    return env


@contextmanager
def sas_contender(args: argparse.Namespace, db_url: str, broker: str, logs: Path) -> Iterator[Callable[[int], dict]]:
    """sas_app's stack, started once; yields one repetition's run, to be called with its number."""
    env = {**os.environ, "SAS_APP": "bench.app:sas", "SAS_DATABASE_URL": db_url, "SAS_BROKER_URL": broker,
           "SAS_HOME": str(logs / "home"), "SAS_TASK_EVENTS": str(args.task_events).lower(),
           "SAS_PREPARED_STATEMENTS": str(not args.pgbouncer).lower(), "PYTHONPATH": CHECKOUT_PATH}
    os.environ.update({k: env[k] for k in ("SAS_DATABASE_URL", "SAS_BROKER_URL", "SAS_HOME", "SAS_TASK_EVENTS",
                                           "SAS_PREPARED_STATEMENTS")})
    from bench.app import sas  # after the environment names the stack
    from sas_app.store.tables import runs

    sas.migrate()
    procs = Processes(logs, env, cwd=REPO)
    try:
        procs.worker("scheduler", "sas.scheduler,sas.supervisor", args.concurrency, pool=args.pool)
        procs.worker("agent", "sas.agent.noop", args.concurrency, pool=args.pool)
        procs.beat("beat")
        scheduler, agent = procs.procs["scheduler"], procs.procs["agent"]
        meter = CpuMeter({**workers(agent=agent.pid, scheduler=scheduler.pid),
                          "beat": lambda: [procs.procs["beat"].pid], **servers(),
                          **({"pooler": named("pgbouncer")} if args.pgbouncer else {})}, reaping=SERVERS)

        def repetition(rep: int) -> dict[str, Any]:
            idle = []
            for i in range(args.idle_runs):
                view = sas.submit(args.workflow, {}, business_key=f"idle-{rep}-{i}").wait(60)
                idle.append(view.run.updated_at - view.run.created_at)
            keys = [f"load-{rep}-{i}" for i in range(args.runs)]
            counted = traffic(sas.store, broker)
            meter.start()
            started = time.time()
            if args.bulk:
                for start in range(0, len(keys), args.bulk):
                    sas.submit_many([Submission(args.workflow, {}, key) for key in keys[start:start + args.bulk]])
            else:
                for key in keys:
                    sas.submit(args.workflow, {}, business_key=key)
            submitted = time.time() - started
            with sas.store.engine.connect() as conn:
                where = runs.c.business_key.like(f"load-{rep}-%")
                deadline = time.monotonic() + args.timeout
                while conn.execute(select(func.count()).where(where, runs.c.process_state == "processed")
                                   ).scalar_one() < args.runs:
                    if time.monotonic() > deadline:
                        raise RuntimeError("sas_app runs did not finish in time")
                    time.sleep(0.2)
                    conn.commit()
                first, last = conn.execute(select(func.min(runs.c.created_at), func.max(runs.c.updated_at))
                                           .where(where)).one()
                latencies = [u - c for u, c in conn.execute(select(runs.c.updated_at, runs.c.created_at)
                                                            .where(where))]
            elapsed = last - first
            after = traffic(sas.store, broker)
            result = {
                "elapsed_s": elapsed, "steps_per_s": 3 * args.runs / elapsed, "runs_per_s": args.runs / elapsed,
                "submit_per_s": args.runs / submitted,
                "latency_idle_p50_ms": 1000 * percentile(idle, 50), "latency_idle_p99_ms": 1000 * percentile(idle, 99),
                "latency_load_p50_ms": 1000 * percentile(latencies, 50),
                "latency_load_p99_ms": 1000 * percentile(latencies, 99),
                "rss_scheduler_mb": rss_mb(scheduler.pid), "rss_agent_mb": rss_mb(agent.pid),
                **meter.per_step(3 * args.runs),
                **{f"{name}_per_step": round((after[name] - before) / (3 * args.runs), 2)
                   for name, before in counted.items()},
            }
            print(f"  sas_app rep {rep + 1}: {result['steps_per_s']:.0f} steps/s", flush=True)
            return result

        yield repetition
    finally:
        procs.stop_all(grace=20)
        sas.store.dispose()


@contextmanager
def celery_contender(args: argparse.Namespace, broker: str, logs: Path) -> Iterator[Callable[[int], dict]]:
    """The Celery chain's workers, started once; yields one repetition's run."""
    from celery import chain

    from bench.app import chain_app, chain_done, chain_noop

    env = {**os.environ, "SAS_BROKER_URL": broker, "BENCH_REDIS_URL": broker, "PYTHONPATH": CHECKOUT_PATH,
           "BENCH_TASK_EVENTS": str(args.task_events).lower()}
    os.environ["BENCH_REDIS_URL"] = broker
    chain_app.conf.broker_url = broker
    chain_app.conf.task_send_sent_event = args.task_events
    client = redis.Redis.from_url(broker)
    procs = Processes(logs, env, cwd=REPO)
    celery_cli = [sys.executable, "-m", "celery", "-A", "bench.app:chain_app", "worker", "-Q", "bench.chain",
                  "-c", str(args.concurrency), "-P", args.pool, "-l", "info", "--without-gossip", "--without-mingle",
                  *(["--task-events"] if args.task_events else [])]
    try:
        procs.start("chain-1", [*celery_cli, "-n", "chain1@%h"], ready=CELERY_READY)
        procs.start("chain-2", [*celery_cli, "-n", "chain2@%h"], ready=CELERY_READY)
        meter = CpuMeter({**workers(chain1=procs.procs["chain-1"].pid, chain2=procs.procs["chain-2"].pid),
                          **servers()}, reaping=SERVERS)

        def repetition(rep: int) -> dict[str, Any]:
            key = f"bench:chain:{rep}"
            client.delete(key)
            meter.start()
            started = time.time()
            sent = {}
            for i in range(args.runs):
                sent[i] = time.time()
                chain(chain_noop.s(), chain_noop.s(), chain_done.s(i, key)).apply_async()
            deadline = time.monotonic() + args.timeout
            while client.hlen(key) < args.runs:
                if time.monotonic() > deadline:
                    raise RuntimeError("celery chains did not finish in time")
                time.sleep(0.2)
            done = {int(k): float(v) for k, v in client.hgetall(key).items()}
            elapsed = max(done.values()) - started
            latencies = [done[i] - sent[i] for i in done]
            result = {"elapsed_s": elapsed, "steps_per_s": 3 * args.runs / elapsed, "runs_per_s": args.runs / elapsed,
                      "latency_load_p50_ms": 1000 * percentile(latencies, 50),
                      "latency_load_p99_ms": 1000 * percentile(latencies, 99),
                      **meter.per_step(3 * args.runs)}
            print(f"  celery chain rep {rep + 1}: {result['steps_per_s']:.0f} steps/s", flush=True)
            return result

        yield repetition
    finally:
        procs.stop_all(grace=20)
        client.close()


def dbos_repetition(args: argparse.Namespace, logs: Path, rep: int) -> dict[str, Any]:
    """One repetition of DBOS, a process of its own on a fresh database."""
    logs.mkdir(parents=True, exist_ok=True)
    db_url = fresh_database(args.postgres, "sas_bench_dbos").replace("postgresql+psycopg2://", "postgresql://")
    done = subprocess.run([sys.executable, "-m", "bench.dbos_runner", "--database-url", db_url,
                           "--runs", str(args.runs), "--concurrency", str(2 * args.concurrency)],
                          capture_output=True, text=True, cwd=REPO, timeout=args.timeout + 120)
    (logs / f"dbos-{rep}.log").write_text(done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"DBOS runner failed:\n{done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    result = {"elapsed_s": out["elapsed"], "steps_per_s": 3 * args.runs / out["elapsed"],
              "runs_per_s": args.runs / out["elapsed"],
              "latency_load_p50_ms": 1000 * percentile(out["latencies"], 50),
              "latency_load_p99_ms": 1000 * percentile(out["latencies"], 99)}
    print(f"  dbos rep {rep + 1}: {result['steps_per_s']:.0f} steps/s", flush=True)
    return result


def spread(values: list[float], digits: int = 2) -> dict[str, float]:
    """The median of ``values`` and their min-max, rounded."""
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def paired(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, float]:
    """The spread of each repetition's steps/s over the other contender's in that turn."""
    return spread([a["steps_per_s"] / b["steps_per_s"] for a, b in zip(ours, theirs, strict=True)], 3)


def summarise(reps: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: spread([r[key] for r in reps]) for key in reps[0]}


def machine() -> dict[str, Any]:
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    versions: dict[str, str | None] = {}
    for package in ("sas_app", "celery", "kombu", "SQLAlchemy", "psycopg2-binary", "redis", "dbos"):
        try:
            versions[package] = version(package)
        except Exception:
            versions[package] = None
    return {"cores": os.cpu_count(), "memory_gb": round(mem_kb / 1024 / 1024, 1), "python": platform.python_version(),
            "versions": versions}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4, help="slots per worker process (two workers)")
    parser.add_argument("--pool", default="prefork", help="Celery pool of every worker (prefork, threads)")
    parser.add_argument("--idle-runs", type=int, default=20, help="runs timed one at a time on an idle system")
    parser.add_argument("--timeout", type=float, default=600)
    service_arguments(parser, redis_db=14)
    parser.add_argument("--skip-dbos", action="store_true")
    parser.add_argument("--workflow", choices=("noop3", "noop3_graph"), default="noop3",
                        help="sas_app's three steps in a straight line, or two side by side and their join")
    parser.add_argument("--task-events", action="store_true",
                        help="every worker sends Celery's task events (the production default, for Flower)")
    parser.add_argument("--bulk", type=int, default=0, metavar="N",
                        help="sas_app submits its runs N at a time with submit_many (default: one by one)")
    parser.add_argument("--pgbouncer", action="store_true",
                        help="sas_app reaches PostgreSQL through PgBouncer (transaction mode), prepared statements off")
    parser.add_argument("--db-latency", type=float, default=0.0, metavar="MS",
                        help="sas_app reaches PostgreSQL through a relay adding MS to each round trip (at least 2)")
    args = parser.parse_args(argv)
    for option, value in (("--runs", args.runs), ("--repeat", args.repeat), ("--idle-runs", args.idle_runs),
                          ("--concurrency", args.concurrency)):
        if value < 1:
            parser.error(f"{option} must be at least 1 (got {value})")
    logs = Path(os.environ.get("BENCH_LOGS", "/tmp/sas-bench"))
    redis.Redis.from_url(args.redis).flushdb()

    # The contenders take turns, one repetition each, on stacks started once: this machine's speed
    # drifts by a tenth within minutes, and all of one contender's repetitions, then all of the
    # next's, once measured a slow spell for one and a quick one for the other.
    print(f"{args.runs} runs x {args.repeat}, the contenders in turn", flush=True)
    sas_reps: list[dict[str, Any]] = []
    celery_reps: list[dict[str, Any]] = []
    dbos_reps: list[dict[str, Any]] = []
    with ExitStack() as stacks:
        sas_db = fresh_database(args.postgres, "sas_bench")
        if args.pgbouncer:
            sas_db = through(sas_db, stacks.enter_context(pgbouncer(args.postgres)))
        if args.db_latency:
            server = make_url(sas_db)
            sas_db = through(sas_db, stacks.enter_context(slow_link(server.host or "127.0.0.1", server.port or 5432,
                                                                    args.db_latency)))
        sas_rep = stacks.enter_context(sas_contender(args, sas_db, args.redis, logs / "sas"))
        celery_rep = stacks.enter_context(celery_contender(args, args.redis, logs / "celery"))
        for rep in range(args.repeat):
            sas_reps.append(sas_rep(rep))
            celery_reps.append(celery_rep(rep))
            if not args.skip_dbos:
                dbos_reps.append(dbos_repetition(args, logs / "dbos", rep))

    result: dict[str, Any] = {
        "date": date.today().isoformat(), "runs": args.runs, "repeat": args.repeat, "workflow": args.workflow,
        "task_events": args.task_events, "bulk": args.bulk, "pgbouncer": args.pgbouncer,
        "db_latency_ms": args.db_latency,
        "workers": {"processes": 2, "concurrency_each": args.concurrency, "pool": args.pool}, "machine": machine(),
        "sas_app": summarise(sas_reps), "celery_chain": summarise(celery_reps),
        "dbos": summarise(dbos_reps) if dbos_reps else None,
        "repetitions": {"sas_app": sas_reps, "celery_chain": celery_reps, "dbos": dbos_reps},
    }
    sas_rate = result["sas_app"]["steps_per_s"]["median"]
    result["ratio_sas_over_celery"] = round(sas_rate / result["celery_chain"]["steps_per_s"]["median"], 3)
    # each repetition's ratio to the other contender's that took its turn beside it
    result["paired_sas_over_celery"] = paired(sas_reps, celery_reps)
    if dbos_reps:
        result["ratio_sas_over_dbos"] = round(sas_rate / result["dbos"]["steps_per_s"]["median"], 3)
        result["paired_sas_over_dbos"] = paired(sas_reps, dbos_reps)
    print_table(result)
    name = ("throughput" + ("-events" if args.task_events else "") + (f"-bulk{args.bulk}" if args.bulk else "")
            + ("-pgbouncer" if args.pgbouncer else "") + (f"-db{args.db_latency:g}ms" if args.db_latency else ""))
    record(args.out, name if args.workflow == "noop3" else f"{name}-{args.workflow}", result)
    return result


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['runs']} runs of 3 no-op steps, median of {result['repeat']} (min-max)")
    for column in ("contender", "steps/s", "runs/s", "p50 ms (load)", "p99 ms (load)"):
        table.add_column(column, justify="right")
    for name in ("sas_app", "celery_chain", "dbos"):
        r = result.get(name)
        if not r:
            continue
        cells = [f"{r[k]['median']:.0f} ({r[k]['min']:.0f}-{r[k]['max']:.0f})"
                 for k in ("steps_per_s", "runs_per_s", "latency_load_p50_ms", "latency_load_p99_ms")]
        table.add_row(name, *cells)
    Console().print(table)
    s = result["sas_app"]
    print(f"sas_app idle latency p50 {s['latency_idle_p50_ms']['median']:.0f} ms, "
          f"p99 {s['latency_idle_p99_ms']['median']:.0f} ms; worker RSS scheduler "
          f"{s['rss_scheduler_mb']['median']} MB, agent {s['rss_agent_mb']['median']} MB")
    for name in ("sas_app", "celery_chain"):
        cpu = {key[4:-3]: value["median"] for key, value in result[name].items() if key.startswith("cpu_")}
        print(f"{name} CPU ms per step: " + ", ".join(f"{part} {ms:.2f}" for part, ms in cpu.items()))
    print(f"sas_app per step: {s['commits_per_step']['median']} commits, {s['messages_per_step']['median']} "
          f"messages published; submitted {s['submit_per_s']['median']:.0f} runs/s")
    print(f"ratio sas/celery {result['ratio_sas_over_celery']}"
          + (f", sas/dbos {result['ratio_sas_over_dbos']}" if "ratio_sas_over_dbos" in result else ""))
    turns = [(name, result[f"paired_sas_over_{name}"]) for name in ("celery", "dbos")
             if f"paired_sas_over_{name}" in result]
    print("turn by turn: " + ", ".join(f"sas/{name} {r['median']} ({r['min']}-{r['max']})" for name, r in turns))


if __name__ == "__main__":
    with stopped_by_signals():  # Ctrl-C or SIGTERM: the bench's own finally stops every process it started
        main()
