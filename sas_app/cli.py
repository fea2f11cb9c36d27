"""The ``sas`` command: migrate the store, run workers and beat, submit, inspect and operate runs,
serve the dashboard.

The application is loaded from ``--app`` / SAS_APP (``module:attribute``; by default the order
example's ``workers.app:sas``, a name, not an import of this package). Other packages add commands
through the ``sas_app.commands`` entry point group — the order example adds ``demo`` and its two
simulated services that way. Errors exit non-zero with one line, never a traceback.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from dataclasses import asdict
from importlib.metadata import entry_points
from typing import Any, NoReturn

import click
from kombu.exceptions import KombuError
from rich.console import Console
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from .app import SasApp
from .errors import SasError
from .graph import Graph
from .migrate import schema_problem
from .settings import mask_secrets, redact_url
from .states import RUN_STATES
from .web.formatting import does, when

DEFAULT_APP = "workers.app:sas"
# Piped or redirected output is not cut to 80 columns: every id and name stays whole.
console = Console(width=None if sys.stdout.isatty() else 200)


def load_app(spec: str) -> SasApp:
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `celery -A` does: your own module in the current folder
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        fail(f"cannot import the app module {module_name!r}: {exc}")
    except Exception as exc:  # building the app failed: a bad setting or URL
        fail(f"cannot load the app {spec!r}: {one_line(exc)}")
    app = getattr(module, attr or "sas", None)
    if not isinstance(app, SasApp):
        fail(f"{spec!r} does not name a SasApp")
    return app


def fail(message: str) -> NoReturn:
    click.echo(f"error: {mask_secrets(message)}", err=True)
    sys.exit(2)


def one_line(exc: BaseException) -> str:
    """An error as one line: its type and the first line of its message (SQLAlchemy's go on with
    the statement and its parameters)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def run_celery(app: SasApp, argv: list[str]) -> None:
    """``celery <argv>`` with this app, as ``app.start`` does, but exiting with the command's exit
    code (a worker stopped at start — its store has no schema — exits 1, not 0)."""
    from celery.bin.celery import celery as celery_command

    celery_command.params[0].default = app.celery
    try:
        code = celery_command.main(args=argv, standalone_mode=False)
    finally:
        celery_command.params[0].default = None
    if isinstance(code, int) and code:
        sys.exit(code)


class SasGroup(click.Group):
    """The ``sas`` command: a state store or broker that is down, or a URL that does not parse,
    ends any command with one line naming the problem (passwords masked), not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (SQLAlchemyError, KombuError, OSError, ValueError) as exc:
            message = one_line(exc)
            if "no such table" in message or "does not exist" in message:
                message += "; run `sas migrate` first"
            where = [f"{label} {redact_url(value)}" for label, value in (
                ("state store", os.environ.get("SAS_DATABASE_URL")), ("broker", os.environ.get("SAS_BROKER_URL")))
                if value]
            fail(message + (f" ({', '.join(where)})" if where else ""))


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


@click.group(cls=SasGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
        message = one_line(exc)
        url = ctx.app.store.engine.url
        if url.get_backend_name() == "postgresql" and f'database "{url.database}" does not exist' in message:
            createdb = f"createdb -h {url.host or 'localhost'} -U {url.username or 'postgres'} {url.database}"
            message += f"; create it first: {createdb}"
        fail(f"migration failed: {message}")
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
    run_celery(app, argv)


@main.command()
@click.option("--schedule", default=None, help="Beat's schedule file (default under SAS_HOME).")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@pass_ctx
def beat(ctx: Context, schedule: str | None, loglevel: str) -> None:
    """Run Celery beat, which starts a Supervisor sweep every SAS_SUPERVISOR_INTERVAL seconds."""
    app = ctx.app
    app.settings.home.mkdir(parents=True, exist_ok=True)
    path = schedule or str(app.settings.home / "celerybeat-schedule")
    run_celery(app, ["beat", "-s", path, "-l", loglevel])


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
@click.option("--version", default=None, help="Only runs of this version of their workflow's definition.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
@pass_ctx
def runs(ctx: Context, state: str | None, workflow: str | None, version: str | None, limit: int,
         as_json: bool) -> None:
    """List runs, newest first."""
    rows = ctx.app.store.list_runs(state=state, workflow=workflow, version=version, limit=limit)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], default=str))
        return
    table = Table("run", "workflow", "version", "business key", "state", "failures", "created")
    for r in rows:
        table.add_row(r.id, r.workflow, r.version or "-", r.business_key, r.process_state, str(r.failure_count),
                      when(r.created_at))
    console.print(table)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
@pass_ctx
def schedules(ctx: Context, as_json: bool) -> None:
    """List the app's schedules: their workflow, cron, overlap policy, last tick handled and next tick."""
    app = ctx.app
    last, now = app.store.schedule_ticks(), app.store.now()
    rows: list[dict[str, Any]] = [
        {"name": s.name, "workflow": s.workflow, "cron": s.cron, "overlap": s.overlap, "catch_up": s.catch_up,
         "last_tick": last.get(s.name), "next_tick": s.next_tick(max(now, last.get(s.name, now)))}
        for s in app.schedules.schedules.values()]
    if as_json:
        click.echo(json.dumps(rows))
        return
    table = Table("schedule", "workflow", "cron", "overlap", "catch up", "last tick (UTC)", "next tick (UTC)")
    for r in rows:
        table.add_row(r["name"], r["workflow"], r["cron"], r["overlap"], f"{r['catch_up']:g} s", when(r["last_tick"]),
                      when(r["next_tick"]))
    console.print(table if rows else "no schedules: declare one with sas.schedule(name, cron=...)")


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
        out["children"] = [asdict(c) for c in ctx.app.store.children(run_id)]
        out["signals"] = [asdict(s) for s in ctx.app.store.signals_of(run_id)]
        click.echo(json.dumps(out, default=str))
        return
    r = view.run
    console.print(f"[bold]{r.id}[/] {r.workflow} version={r.version or '-'} key={r.business_key} "
                  f"state=[bold]{r.process_state}[/] failures={r.failure_count} locked_by={r.locked_by or '-'}")
    if r.schedule:
        console.print(f"started by schedule {r.schedule}")
    if r.deadline:
        console.print(f"deadline {when(r.deadline)} UTC")
    if r.slot:
        holds = "holds a slot" if r.process_state in ("processing", "compensating") else "waits for a slot"
        console.print(f"one at a time per key {r.slot!r} (at most {r.max_running}): {holds} since "
                      f"{when(r.slot_since)} UTC")
    if r.error:
        console.print(f"error: {r.error}")
    if r.parent_run_id:
        console.print(f"child of run {r.parent_run_id} (its step #{r.parent_position}), depth {r.depth}")
    for child in ctx.app.store.children(r.id):
        console.print(f"child run {child.id} ({child.workflow}, step #{child.parent_position}): {child.process_state}")
    graph = Graph(view.steps)
    steps = Table("#", "step", "after", "agent", "state", "attempt", "failures", "complete by", "error")
    for s, is_branch in graph.outline():
        after = "" if is_branch or s.is_undo else ", ".join(graph.waits_for_names(s)) or "-"
        steps.add_row(str(s.position), f"  └ {s.name}" if is_branch else s.name, after, does(s),
                      s.state, str(s.attempt), f"{s.failure_count}/{s.max_failures}", when(s.complete_by),
                      s.error or "")
    console.print(steps)
    signals = ctx.app.store.signals_of(r.id)
    if signals:
        table = Table("received", "event", "status", "by", "payload")
        for sig in signals:
            table.add_row(when(sig.received_at), sig.event, sig.status, sig.sent_by or "", json.dumps(sig.payload))
        console.print(table)
    history = Table("at", "step", "event", "from", "to", "attempt", "actor")
    for e in view.events:
        history.add_row(when(e.at), "-" if e.position is None else str(e.position), e.kind,
                        e.from_state or "", e.to_state or "", "" if e.attempt is None else str(e.attempt),
                        e.actor or "")
    console.print(history)


def _json_option(value: str | None, option: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        fail(f"{option} is not valid JSON: {exc}")


def _operator_options(fn: Any) -> Any:
    fn = click.option("--by", default=lambda: os.environ.get("USER") or "operator", show_default="$USER",
                      help="Who is acting (recorded in the run's history).")(fn)
    return click.option("--reason", default="", help="Why (recorded in the run's history).")(fn)


def _operate(action: Any) -> None:
    try:
        action()
    except SasError as exc:
        fail(str(exc))


@main.command()
@click.argument("run_id")
@click.option("--step", default=None, help="The failed step to resubmit (default: the failed one).")
@click.option("--input", "step_input", default=None, help="An edited input for that step, as JSON.")
@_operator_options
@pass_ctx
def resubmit(ctx: Context, run_id: str, step: str | None, step_input: str | None, by: str, reason: str) -> None:
    """Resubmit a failed step of a run in error, once its cause is fixed; the run resumes there."""
    edited = _json_option(step_input, "--input")
    _operate(lambda: ctx.app.resubmit(run_id, by=by, reason=reason, step=step, step_input=edited))
    click.echo(f"run {run_id} resubmitted")


@main.command()
@click.argument("run")
@click.argument("event")
@click.option("--payload", default="{}", show_default=True, help="The signal's payload (the wait's result), as JSON.")
@click.option("--by", default=lambda: os.environ.get("USER") or "operator", show_default="$USER",
              help="Who sends it (recorded in the run's history).")
@pass_ctx
def signal(ctx: Context, run: str, event: str, payload: str, by: str) -> None:
    """Send EVENT to a run waiting for it (a WaitFor step). RUN is a run id or WORKFLOW:BUSINESS_KEY."""
    workflow, colon, key = run.partition(":")
    target: str | tuple[str, str] = (workflow, key) if colon else run
    value = _json_option(payload, "--payload")
    try:
        receipt = ctx.app.signal(target, event, value, by=by)
    except SasError as exc:
        fail(str(exc))
    click.echo(f"signal {event!r} for run {receipt.run_id}: {receipt.status}")


@main.command("mark-done")
@click.argument("run_id")
@click.argument("step")
@click.option("--result", default=None, help="The step's result, as JSON.")
@_operator_options
@pass_ctx
def mark_done(ctx: Context, run_id: str, step: str, result: str | None, by: str, reason: str) -> None:
    """Record a step as done by hand (or skipped); the run goes on with the next one."""
    value = _json_option(result, "--result")
    _operate(lambda: ctx.app.mark_done(run_id, step, by=by, reason=reason, result=value))
    click.echo(f"step {step} of run {run_id} marked done")


@main.command()
@click.argument("run_id")
@_operator_options
@pass_ctx
def pause(ctx: Context, run_id: str, by: str, reason: str) -> None:
    """Dispatch no further step of a run until it is resumed."""
    _operate(lambda: ctx.app.pause(run_id, by=by, reason=reason))
    click.echo(f"run {run_id} paused")


@main.command()
@click.argument("run_id")
@_operator_options
@pass_ctx
def resume(ctx: Context, run_id: str, by: str, reason: str) -> None:
    """Resume a paused run."""
    _operate(lambda: ctx.app.resume(run_id, by=by, reason=reason))
    click.echo(f"run {run_id} resumed")


@main.command()
@click.argument("run_id")
@_operator_options
@pass_ctx
def cancel(ctx: Context, run_id: str, by: str, reason: str) -> None:
    """Cancel a run: no further step starts and whatever may have been done is undone."""
    states: list[str] = []
    _operate(lambda: states.append(ctx.app.cancel(run_id, by=by, reason=reason)))
    click.echo(f"run {run_id} {states[0]}")


@main.command()
@click.argument("run_id")
@_operator_options
@pass_ctx
def compensate(ctx: Context, run_id: str, by: str, reason: str) -> None:
    """Undo a processing run, or a run in error, now."""
    _operate(lambda: ctx.app.compensate(run_id, by=by, reason=reason))
    click.echo(f"run {run_id} compensating")


@main.command()
@click.option("--older-than", "older_than", required=True, help="How long ago the runs ended: 30d, 12h, 90m, 3600s.")
@click.option("--state", "states", default="processed,compensated,cancelled", show_default=True,
              help="Which finished runs (error too, if named).")
@click.option("--batch", type=click.IntRange(1, 100_000), default=1000, show_default=True,
              help="Runs deleted per transaction.")
@click.option("--dry-run", is_flag=True, help="Say how many runs would go; delete nothing.")
@pass_ctx
def purge(ctx: Context, older_than: str, states: str, batch: int, dry_run: bool) -> None:
    """Delete finished runs that ended long ago, with their steps, events, signals, alerts and
    notifications, in bounded batches. A run not finished is never deleted."""
    from .retention import parse_duration, parse_states
    from .retention import purge as purge_runs

    try:
        seconds, chosen = parse_duration(older_than), parse_states(states)
    except ValueError as exc:
        fail(str(exc))
    if dry_run:
        click.echo(f"would delete {ctx.app.store.count_purgeable(seconds, chosen)} run(s) "
                   f"({', '.join(chosen)}, ended more than {older_than} ago)")
        return
    done = purge_runs(ctx.app.store, seconds, chosen, batch=batch)
    rate = done.runs / done.seconds if done.seconds else 0.0
    click.echo(f"deleted {done.runs} run(s) and {done.rows} row(s) in all, in {done.seconds:.1f} s "
               f"({rate:.0f} runs/s)")


LOOPBACK = ("127.0.0.1", "localhost", "::1")


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=5555, show_default=True)
@click.option("--basic-auth", "basic_auth", envvar="FLOWER_BASIC_AUTH", default="",
              help="user:password[,user:password...] (env FLOWER_BASIC_AUTH); required unless on a loopback address.")
@pass_ctx
def flower(ctx: Context, host: str, port: int, basic_auth: str) -> None:
    """Serve Flower for this app: its broker, its task names, its workers' task events (SAS_TASK_EVENTS)."""
    from .web.dashboard import parse_basic_auth

    try:
        parse_basic_auth(basic_auth)
    except ValueError as exc:
        fail(f"--basic-auth: {exc}")
    if not basic_auth and host not in LOOPBACK:
        fail(f"Flower on {host} would show every task's arguments to anyone who can reach it: give --basic-auth "
             "user:password (or FLOWER_BASIC_AUTH), or listen on 127.0.0.1")
    argv = ["flower", f"--port={port}", f"--address={host}"]
    if basic_auth:
        argv.append(f"--basic-auth={basic_auth}")
    click.echo(f"Flower on http://{host}:{port}/" + (" (basic auth)" if basic_auth else ""), err=True)
    run_celery(ctx.app, argv)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8080, show_default=True)
@click.option("--basic-auth", "basic_auth", envvar="FLOWER_BASIC_AUTH", default="",
              help="user:password[,user:password...], as Flower's (env FLOWER_BASIC_AUTH). Default: no auth.")
@click.option("--flower-url", envvar="SAS_FLOWER_URL", default="",
              help="Flower's address, for links to each dispatch's task (env SAS_FLOWER_URL).")
@click.option("--threads", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--secret", envvar="SAS_DASHBOARD_SECRET", default="",
              help="Signs the forms' CSRF tokens (env SAS_DASHBOARD_SECRET; default: random per process).")
@pass_ctx
def dashboard(ctx: Context, host: str, port: int, basic_auth: str, flower_url: str, threads: int,
              secret: str) -> None:
    """Serve the dashboard and the Prometheus metrics (/metrics) of the state store. With
    --basic-auth, runs waiting for an event can be approved or rejected from their page."""
    from waitress import serve

    from .web.dashboard import create_dashboard, parse_basic_auth

    try:
        credentials = parse_basic_auth(basic_auth)
    except ValueError as exc:
        fail(f"--basic-auth: {exc}")
    problem = schema_problem(ctx.app.store.engine)
    if problem:
        fail(problem)
    app = create_dashboard(ctx.app, basic_auth=credentials, flower_url=flower_url, secret=secret)
    click.echo(f"sas dashboard on http://{host}:{port}/" + (" (basic auth)" if credentials else ""), err=True)
    serve(app, host=host, port=port, threads=threads, ident="sas-dashboard")


def add_commands(group: click.Group) -> None:
    """The commands other installed packages add to ``sas`` (entry point group ``sas_app.commands``).
    One that fails to load is left out with a warning, so a broken add-on never breaks ``sas``.
    A command's module must not import this one: ``python -m sas_app.cli`` would load it twice."""
    for point in entry_points(group="sas_app.commands"):
        if point.name in group.commands:
            continue
        try:
            command = point.load()
        except Exception as exc:
            logging.getLogger("sas.cli").warning("command %r (%s) not loaded: %s", point.name, point.value,
                                                 one_line(exc))
            continue
        group.add_command(command, point.name)


add_commands(main)


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("SAS_APP", DEFAULT_APP)
    main()
