"""The ``sas`` command: migrate the store, run workers and beat, submit, inspect and operate runs,
serve the dashboard.

The application is loaded from ``--app`` / SAS_APP (``module:attribute``; by default the order
example's ``workers.app:sas``, a name, not an import of this package). Other packages add commands
through the ``sas_app.commands`` entry point group — the order example adds ``demo`` and its two
simulated services that way. Errors exit non-zero with one line, never a traceback.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from importlib.metadata import entry_points
from typing import Any

import click
from kombu.exceptions import KombuError
from rich.markup import escape
from rich.table import Table
from sqlalchemy.exc import SQLAlchemyError

from sas_app.cli import access, fleet, operate, serve
from sas_app.cli.base import DEFAULT_APP, Context, console, fail, named_run, pass_ctx
from sas_app.definitions.inputs import input_schema
from sas_app.engine.graph import Graph
from sas_app.errors import SasError, UnknownWorkflow, one_line
from sas_app.settings import redact_url
from sas_app.states import RUN_STATES
from sas_app.testing.processes import hold_lifeline
from sas_app.web.formatting import after_text, detail_text, does, result_text, when

#: ``sas --help`` lists the commands by who uses them; any other (added by an installed package)
#: comes last
SECTIONS = {
    "Run a deployment": ["migrate", "worker", "beat", "dashboard", "flower", "doctor", "purge"],
    "Run a fleet": ["health", "backlog", "kubernetes"],
    "Submit and look at runs": ["submit", "runs", "show", "workflows", "schedules", "signal"],
    "Operate runs": ["pause", "resume", "cancel", "compensate", "resubmit", "mark-done", "rerun"],
    "Access": ["token", "audit"],
    "Try it: the order example": ["demo", "payment-service", "warehouse-service"],
}


class SasGroup(click.Group):
    """The ``sas`` command: a state store or broker that is down, or a URL that does not parse,
    ends any command with one line naming the problem (passwords masked), not a traceback. Its
    help lists the commands in :data:`SECTIONS`."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        listed = {name for names in SECTIONS.values() for name in names}
        others = sorted(set(self.list_commands(ctx)) - listed)
        for title, names in [*SECTIONS.items(), ("Added by installed packages", others)]:
            rows = []
            for name in names:
                command = self.get_command(ctx, name)
                if command is not None and not command.hidden:
                    rows.append((name, command.get_short_help_str(formatter.width - 6 - max(map(len, names)))))
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

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


@click.group(cls=SasGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--app", "spec", envvar="SAS_APP", default=DEFAULT_APP, show_default=True,
              help="The SasApp to use, as module:attribute (env SAS_APP); the default is the order example.")
@click.pass_context
def main(ctx: click.Context, spec: str) -> None:
    """sas_app: the Scheduler Agent Supervisor pattern on Celery."""
    hold_lifeline()  # started by a harness (sas demo, a bench): gone with it, however it ends
    ctx.obj = Context(spec)


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
    except UnknownWorkflow as exc:
        fail(f"{exc} ({ctx.which_app()})")
    except (SasError, TimeoutError) as exc:
        fail(str(exc))


@main.command()
@click.option("--state", type=click.Choice(RUN_STATES), default=None)
@click.option("--workflow", default=None)
@click.option("--version", default=None, help="Only runs of this version of their workflow's definition.")
@click.option("--failure", default=None, help="Only runs whose error says this (any case), e.g. a service's name.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
@pass_ctx
def runs(ctx: Context, state: str | None, workflow: str | None, version: str | None, failure: str | None,
         limit: int, as_json: bool) -> None:
    """List runs, newest first."""
    rows = ctx.app.store.list_runs(state=state, workflow=workflow, version=version, failure=failure, limit=limit)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows], default=str))
        return
    table = Table("run", "workflow", "version", "business key", "state", "failures", "created")
    for r in rows:
        table.add_row(r.id, r.workflow, r.version or "-", escape(r.business_key), r.process_state, str(r.failure_count),
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
@click.option("--json", "as_json", is_flag=True, help="One JSON array, with each input's JSON Schema.")
@pass_ctx
def workflows(ctx: Context, as_json: bool) -> None:
    """List the app's workflows: their version, steps and input model (its JSON Schema with --json)."""
    rows: list[dict[str, Any]] = [
        {"name": w.name, "version": w.run_version, "description": w.description, "steps": [s.name for s in w.specs],
         "input": None if w.input is None else w.input.__name__,
         "input_schema": None if w.input is None else input_schema(w.input)}
        for w in sorted(ctx.app.workflows.values(), key=lambda w: w.name)]
    if as_json:
        click.echo(json.dumps(rows))
        return
    table = Table("workflow", "version", "steps", "input", "description")
    for r in rows:
        table.add_row(r["name"], r["version"], ", ".join(r["steps"]), r["input"] or "-", r["description"])
    console.print(table if rows else f"no workflows registered; {ctx.which_app()}")


@main.command()
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of tables.")
@pass_ctx
def show(ctx: Context, run: str, as_json: bool) -> None:
    """Show a run, its steps (with their results) and its event history. RUN is a run id or
    WORKFLOW:BUSINESS_KEY."""
    try:
        run_id = ctx.app.signals.run_id(named_run(run))
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
    console.print(f"[bold]{r.id}[/] {r.workflow} version={r.version or '-'} key={escape(r.business_key)} "
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
        console.print(f"error: {escape(r.error)}")
    if r.parent_run_id:
        console.print(f"child of run {r.parent_run_id} (its step #{r.parent_position}), depth {r.depth}")
    if r.rerun_of:
        console.print(f"rerun of run {r.rerun_of}, from step {r.rerun_from}")
    if r.rerun_as:
        console.print(f"rerun as run {r.rerun_as}")
    for child in ctx.app.store.children(r.id):
        console.print(f"child run {child.id} ({child.workflow}, step #{child.parent_position}): {child.process_state}")
    graph = Graph(view.steps)
    steps = Table("#", "step", "after", "agent", "state", "attempt", "failures", "complete by", "error or reason")
    for s, is_branch in graph.outline():
        after = "" if is_branch or s.is_undo else after_text(graph.waits_for_names(s), s)
        steps.add_row(str(s.position), f"  └ {s.name}" if is_branch else s.name, after, does(s),
                      s.state, str(s.attempt), f"{s.failure_count}/{s.max_failures}", when(s.complete_by),
                      escape(s.error or ""))
    console.print(steps)
    results = Table("#", "step", "result")
    for s in view.steps:
        if s.result is not None:
            results.add_row(str(s.position), s.name, escape(result_text(s.result, width=150)))
    if results.row_count:
        console.print(results)
    signals = ctx.app.store.signals_of(r.id)
    if signals:
        table = Table("received", "event", "status", "by", "payload")
        for sig in signals:
            table.add_row(when(sig.received_at), sig.event, sig.status, escape(sig.sent_by or ""),
                          escape(json.dumps(sig.payload)))
        console.print(table)
    history = Table("at", "step", "event", "from", "to", "attempt", "actor", "detail")
    for e in view.events:
        history.add_row(when(e.at), "-" if e.position is None else str(e.position), e.kind,
                        e.from_state or "", e.to_state or "", "" if e.attempt is None else str(e.attempt),
                        escape(e.actor or ""), escape(detail_text(e.detail)))
    console.print(history)


for _command in (*serve.COMMANDS, *operate.COMMANDS, *access.COMMANDS, *fleet.COMMANDS):
    main.add_command(_command)


def add_commands(group: click.Group) -> None:
    """The commands other installed packages add to ``sas`` (entry point group ``sas_app.commands``).
    One that fails to load is left out with a warning, so a broken add-on never breaks ``sas``.
    A command's module must not import this one: it is still being loaded when the command loads."""
    for point in entry_points(group="sas_app.commands"):
        if point.name in group.commands:
            continue
        try:
            command = point.load()
        except Exception as exc:
            logging.getLogger(__name__).warning("command %r (%s) not loaded: %s", point.name, point.value,
                                                 one_line(exc))
            continue
        group.add_command(command, point.name)


add_commands(main)
