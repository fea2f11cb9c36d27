"""The ``sas`` command: migrate the store, run workers and beat, submit and inspect runs.

The application is loaded from ``--app`` / SAS_APP (``module:attribute``, default the order
example ``workers.app:sas``). Errors exit non-zero with one line, never a traceback.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from .app import SasApp
from .errors import SasError
from .models import RUN_STATES

DEFAULT_APP = "workers.app:sas"
# Piped or redirected output is not cut to 80 columns: every id and name stays whole.
console = Console(width=None if sys.stdout.isatty() else 200)


def load_app(spec: str) -> SasApp:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        fail(f"cannot import the app module {module_name!r}: {exc}")
    app = getattr(module, attr or "sas", None)
    if not isinstance(app, SasApp):
        fail(f"{spec!r} does not name a SasApp")
    return app


def fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


class Context:
    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._app: SasApp | None = None

    @property
    def app(self) -> SasApp:
        if self._app is None:
            self._app = load_app(self.spec)
        return self._app


pass_ctx = click.make_pass_decorator(Context)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--app", "spec", envvar="SAS_APP", default=DEFAULT_APP, show_default=True,
              help="The SasApp to use, as module:attribute (env SAS_APP).")
@click.pass_context
def main(ctx: click.Context, spec: str) -> None:
    """sas_app: the Scheduler Agent Supervisor pattern on Celery."""
    ctx.obj = Context(spec)


@main.command()
@pass_ctx
def migrate(ctx: Context) -> None:
    """Create or upgrade the state store's schema (safe to run again)."""
    try:
        ctx.app.migrate()
    except Exception as exc:  # a database that is down or refuses us: one line, no traceback
        fail(f"migration failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    click.echo("schema is up to date")


@main.command()
@click.option("-Q", "--queues", default=None,
              help="Comma-separated queues to consume (default: all of this app's queues).")
@click.option("-c", "--concurrency", type=int, default=None, help="Worker processes (default SAS_AGENT_CONCURRENCY).")
@click.option("-P", "--pool", default="prefork", show_default=True, help="Celery pool: prefork, threads, solo.")
@click.option("-n", "--hostname", default=None, help="Worker node name (celery's -n).")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@pass_ctx
def worker(ctx: Context, queues: str | None, concurrency: int | None, pool: str,
           hostname: str | None, loglevel: str) -> None:
    """Run a Celery worker for the Scheduler, Supervisor and/or agent queues.

    Same as ``celery worker`` with this app, its queues, prefetch 1 and task events on."""
    app = ctx.app
    known = app.queues()
    chosen = queues.split(",") if queues else known
    unknown = [q for q in chosen if q not in known]
    if unknown:
        fail(f"unknown queue(s) {', '.join(unknown)}; this app has {', '.join(known)}")
    argv = ["worker", "-Q", ",".join(chosen), "-P", pool, "-l", loglevel,
            "-c", str(concurrency or app.settings.agent_concurrency), "--without-gossip", "--without-mingle"]
    if hostname:
        argv += ["-n", hostname]
    if app.settings.task_events:
        argv.append("-E")
    app.celery.worker_main(argv=argv)


@main.command()
@click.option("--schedule", default=None, help="Beat's schedule file (default under SAS_HOME).")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@pass_ctx
def beat(ctx: Context, schedule: str | None, loglevel: str) -> None:
    """Run Celery beat, which starts a Supervisor sweep every SAS_SUPERVISOR_INTERVAL seconds."""
    app = ctx.app
    app.settings.home.mkdir(parents=True, exist_ok=True)
    path = schedule or str(app.settings.home / "celerybeat-schedule")
    app.celery.start(argv=["beat", "-s", path, "-l", loglevel])


@main.command()
@click.argument("workflow")
@click.option("--key", "business_key", required=True, help="The business key (e.g. the order id).")
@click.option("--payload", default="{}", show_default=True, help="The payload, as a JSON object.")
@click.option("--wait", "wait_for", type=float, default=None, help="Wait up to this many seconds for the end.")
@pass_ctx
def submit(ctx: Context, workflow: str, business_key: str, payload: str, wait_for: float | None) -> None:
    """Submit a run; prints its id (the same id again for a business key already submitted)."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError as exc:
        fail(f"--payload is not valid JSON: {exc}")
    try:
        handle = ctx.app.submit(workflow, data, business_key=business_key)
        click.echo(handle.id)
        if wait_for is not None:
            view = handle.wait(wait_for)
            click.echo(view.process_state)
    except (SasError, TimeoutError) as exc:
        fail(str(exc))


@main.command()
@click.option("--state", type=click.Choice(RUN_STATES), default=None)
@click.option("--workflow", default=None)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
@pass_ctx
def runs(ctx: Context, state: str | None, workflow: str | None, limit: int, as_json: bool) -> None:
    """List runs, newest first."""
    rows = ctx.app.store.list_runs(state=state, workflow=workflow, limit=limit)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], default=str))
        return
    table = Table("run", "workflow", "business key", "state", "failures", "created")
    for r in rows:
        table.add_row(r.id, r.workflow, r.business_key, r.process_state, str(r.failure_count), when(r.created_at))
    console.print(table)


@main.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of tables.")
@pass_ctx
def show(ctx: Context, run_id: str, as_json: bool) -> None:
    """Show a run, its steps and its event history."""
    try:
        view = ctx.app.get_run(run_id)
    except SasError as exc:
        fail(str(exc))
    if as_json:
        out: dict[str, Any] = asdict(view.run)
        out["steps"] = [asdict(s) for s in view.steps]
        out["events"] = [asdict(e) for e in view.events]
        click.echo(json.dumps(out, default=str))
        return
    r = view.run
    console.print(f"[bold]{r.id}[/] {r.workflow} key={r.business_key} state=[bold]{r.process_state}[/] "
                  f"failures={r.failure_count} locked_by={r.locked_by or '-'}")
    if r.error:
        console.print(f"error: {r.error}")
    steps = Table("#", "step", "agent", "state", "attempt", "failures", "complete by", "error")
    for s in view.steps:
        steps.add_row(str(s.position), s.name, f"{s.agent}.{s.action}", s.state, str(s.attempt),
                      f"{s.failure_count}/{s.max_failures}", when(s.complete_by), s.error or "")
    console.print(steps)
    history = Table("at", "step", "event", "from", "to", "attempt", "actor")
    for e in view.events:
        history.add_row(when(e.at), "-" if e.position is None else str(e.position), e.kind,
                        e.from_state or "", e.to_state or "", "" if e.attempt is None else str(e.attempt),
                        e.actor or "")
    console.print(history)


@main.command()
@click.option("--orders", type=click.IntRange(1, 100_000), default=50, show_default=True,
              help="How many orders to submit.")
@click.option("--fault-rate", type=click.FloatRange(0, 1), default=0.2, show_default=True,
              help="Share of orders given a fault (transient error, hang past complete-by, latency).")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed for the fault plan.")
@click.option("--timeout", type=float, default=300, show_default=True, help="Give up after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def demo(orders: int, fault_rate: float, seed: int, timeout: float, as_json: bool) -> None:
    """Run the order example live: worker, beat and payment-service processes, faults injected,
    one agent worker crash; ends with a summary (lost and duplicate charges must be 0)."""
    from workers.demo import print_summary, run_demo

    try:
        summary = run_demo(orders, fault_rate, seed, timeout, as_json)
    except KeyboardInterrupt:
        fail("interrupted; every process the demo started has been stopped")
    if as_json:
        click.echo(json.dumps(summary))
    else:
        print_summary(summary)
    if summary["lost"] or summary["duplicate_charges"]:
        sys.exit(1)


@main.command("payment-service")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8765, show_default=True)
@click.option("--ledger", default=None, help="The service's ledger file (default under SAS_HOME).")
@click.option("--transient-rate", type=float, default=0.0)
@click.option("--hang-rate", type=float, default=0.0)
@click.option("--permanent-rate", type=float, default=0.0)
@click.option("--crash-rate", type=float, default=0.0)
def payment_service(host: str, port: int, ledger: str | None, transient_rate: float, hang_rate: float,
                    permanent_rate: float, crash_rate: float) -> None:
    """Start the simulated remote payment service of the order example."""
    from workers import payment_service as service

    argv = ["--host", host, "--port", str(port), "--transient-rate", str(transient_rate),
            "--hang-rate", str(hang_rate), "--permanent-rate", str(permanent_rate), "--crash-rate", str(crash_rate)]
    if ledger:
        argv += ["--ledger", ledger]
    service.main(argv)


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("SAS_APP", DEFAULT_APP)
    main()
