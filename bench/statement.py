"""PostgreSQL's CPU for one reply's statement, taken apart.

One client and one connection at a time, on a fresh database: ``noop3`` runs (bench.app) are
submitted first, then each run's three success replies are sent as the Scheduler sends them
(:meth:`HotPathTx.complete_alone`, a statement that is its own transaction), and PostgreSQL's CPU
(every ``postgres`` process, read as bench.cpu reads it) is divided by the statements. The same
replies are sent in other ways beside it, and two statements of a known size for scale:

* ``as_sent``: psycopg2 with SQL ``PREPARE`` and ``EXECUTE``, what sas_app does — for these runs,
  which have no reply queue, the narrower statements (``COMPLETE_NEXT``, then ``COMPLETE_LAST``);
* ``with_notifications``: the same replies through the statement a run with a reply queue gets
  (``COMPLETE_ALONE``: its notifications' part inserts nothing here);
* ``no_flush_wait``: the same with ``synchronous_commit = off`` (the commit does not wait for the
  WAL's flush — what the commit's wait costs, not something to ship);
* ``psycopg3``: the same statement through psycopg 3's protocol-level prepared statements;
* ``one_row_update``: one row updated in a table of a thousand, a transaction of its own;
* ``two_updates_two_inserts``: two rows updated and two inserted in one statement, in the same
  small tables.

The ways take turns, ``--repeat`` times, so that a slow spell of the machine falls on all of them
alike; prints the medians and writes ``bench/results/statement-<date>.json``. Usage:

    python -m bench.statement [--runs 300] [--repeat 4] [--postgres URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import date
from typing import Any

from bench.cpu import CpuMeter, named
from bench.throughput import REPO, fresh_database, machine, postgres_arguments, record

POSITIONS = range(3)
SCALE_TABLES = """
CREATE TABLE IF NOT EXISTS bench_rows (id int PRIMARY KEY, x int NOT NULL);
INSERT INTO bench_rows SELECT g, 0 FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS bench_log (id bigserial PRIMARY KEY, row_id int NOT NULL, note text NOT NULL);
"""
ONE_ROW_UPDATE = "UPDATE bench_rows SET x = x + 1 WHERE id = %(id)s"
TWO_UPDATES_TWO_INSERTS = """
WITH a AS (UPDATE bench_rows SET x = x + 1 WHERE id = %(id)s RETURNING id),
     b AS (UPDATE bench_rows SET x = x + 1 WHERE id = %(id)s %% 1000 + 1 RETURNING id),
     c AS (INSERT INTO bench_log (row_id, note) SELECT id, 'completed' FROM a
           UNION ALL SELECT id, 'running' FROM b RETURNING id)
SELECT count(*) FROM c
"""


def _measure(send: Callable[[int], None], count: int) -> float:
    """PostgreSQL's CPU in ms a statement for ``count`` calls of ``send(i)``."""
    meter = CpuMeter({"postgres": named("postgres")}, reaping=["postgres"])
    meter.start()
    for i in range(count):
        send(i)
    return meter.per_step(count)["cpu_postgres_ms"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300, help="runs a way and turn (three replies each)")
    parser.add_argument("--repeat", type=int, default=4)
    postgres_arguments(parser)
    args = parser.parse_args(argv)
    url = fresh_database(args.postgres, "sas_bench_statement")
    with tempfile.TemporaryDirectory() as home:
        os.environ.update({"SAS_DATABASE_URL": url, "SAS_BROKER_URL": "memory://", "SAS_HOME": home,
                           "SAS_TASK_EVENTS": "false"})
        sys.path.insert(0, str(REPO))
        result = _bench(args, url)
    result["command"] = "python -m bench.statement " + " ".join(argv if argv is not None else sys.argv[1:])
    record(args.out, "statement", result)
    return result


def _bench(args: argparse.Namespace, url: str) -> dict[str, Any]:
    import psycopg
    from psycopg.types.json import Jsonb
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from bench.app import sas  # after the environment names the database
    from sas_app.store import Store
    from sas_app.store.hot_path import COMPLETE_LAST, COMPLETE_NEXT

    sas.migrate()
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    unflushed = Store(make_url(url).update_query_dict({"options": "-c synchronous_commit=off"})
                      .render_as_string(hide_password=False))
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(SCALE_TABLES)
    engine.dispose()
    middle, last = (str(s.compile(dialect=sas.store.engine.dialect)) for s in (COMPLETE_NEXT, COMPLETE_LAST))
    fresh = iter(range(10**9))

    def submitted() -> list[str]:
        return [sas.submit("noop3", {}, business_key=f"statement-{next(fresh)}").id for _ in range(args.runs)]

    def replied(reply: Callable[[str, int], None]) -> Callable[[], float]:
        """A way: fresh runs submitted, then each one's three replies sent with ``reply(run, position)``."""
        def way() -> float:
            replies = [(run, position) for run in submitted() for position in POSITIONS]
            return _measure(lambda i: reply(*replies[i]), len(replies))
        return way

    def through(store: Store, quiet: bool = True) -> Callable[[str, int], None]:
        def reply(run: str, position: int) -> None:
            with store.alone() as tx:
                done = tx.hot_path.complete_alone(run, position, 1, {}, "bench", quiet=quiet,
                                                  last=position == POSITIONS[-1])
                assert done is not None
        return reply

    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as pg3:
        def psycopg3(run: str, position: int) -> None:
            done = pg3.execute(last if position == POSITIONS[-1] else middle, {
                "b_run_id": run, "b_position": position, "b_attempt": 1, "b_result": Jsonb({}), "b_locked_by": "bench",
            }, prepare=True)
            assert done.fetchone()[0] is not None

        def scale(sql: str) -> Callable[[], float]:
            def send(i: int) -> None:
                pg3.execute(sql, {"id": i % 1000 + 1}, prepare=True)
            return lambda: _measure(send, 3 * args.runs)

        ways: dict[str, Callable[[], float]] = {
            "as_sent": replied(through(sas.store)), "with_notifications": replied(through(sas.store, quiet=False)),
            "no_flush_wait": replied(through(unflushed)),
            "psycopg3": replied(psycopg3),
            "one_row_update": scale(ONE_ROW_UPDATE), "two_updates_two_inserts": scale(TWO_UPDATES_TWO_INSERTS),
        }
        for way in ways.values():  # warm: connections, prepared statements, caches
            way()
        print(f"{args.runs} runs (three replies each) a way and turn, {args.repeat} turns", flush=True)
        taken: dict[str, list[float]] = {name: [] for name in ways}
        for rep in range(args.repeat):
            for name, way in ways.items():
                taken[name].append(way())
            print(f"  turn {rep + 1}: " + ", ".join(f"{name} {v[-1]:.3f}" for name, v in taken.items()), flush=True)
    unflushed.dispose()
    sas.store.dispose()
    medians = {name: round(statistics.median(values), 3) for name, values in taken.items()}
    print(f"{'PostgreSQL CPU a statement, ms (median)':<44}")
    for name, value in medians.items():
        print(f"  {name:<40} {value:>7.3f}")
    return {"date": date.today().isoformat(), "machine": machine(), "runs": args.runs, "repeat": args.repeat,
            "ms_per_statement": medians, "repetitions": taken}


if __name__ == "__main__":
    main()
