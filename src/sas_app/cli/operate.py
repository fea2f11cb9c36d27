"""``sas`` commands of an operator: ``resubmit``, ``mark-done``, ``pause``, ``resume``, ``cancel``
and ``compensate`` (each refused with a clear message when the run's state does not allow it, and
recorded with who and why), ``signal`` (ends a run's wait), ``purge`` (retention) and ``doctor``
(is the deployment healthy: :mod:`sas_app.interfaces.doctor`)."""

from __future__ import annotations

import json
import os
import sys

import click
from rich.table import Table

from sas_app.cli.base import Context, console, fail, json_option, named_run, operate, operator_options, pass_ctx
from sas_app.errors import SasError
from sas_app.interfaces.access import Actor
from sas_app.interfaces.operations import done_message


@click.command()
@click.argument("run_id")
@click.option("--step", default=None, help="The failed step to resubmit (default: the failed one).")
@click.option("--input", "step_input", default=None, help="An edited input for that step, as JSON.")
@operator_options
@pass_ctx
def resubmit(ctx: Context, run_id: str, step: str | None, step_input: str | None, by: str, reason: str) -> None:
    """Resubmit a failed step of a run in error, once its cause is fixed; the run resumes there."""
    edited = json_option(step_input, "--input")
    operate(ctx, "resubmit", run_id, by, reason,
            lambda: ctx.app.resubmit(run_id, by=by, reason=reason, step=step, step_input=edited), step)
    click.echo(done_message("resubmit", run_id))


@click.command()
@click.argument("run")
@click.argument("event")
@click.option("--payload", default="{}", show_default=True, help="The signal's payload (the wait's result), as JSON.")
@click.option("--by", default=lambda: os.environ.get("USER") or "operator", show_default="$USER",
              help="Who sends it (recorded in the run's history).")
@pass_ctx
def signal(ctx: Context, run: str, event: str, payload: str, by: str) -> None:
    """Send EVENT to a run waiting for it (a WaitFor step). RUN is a run id or WORKFLOW:BUSINESS_KEY."""
    named = named_run(run)
    value = json_option(payload, "--payload")
    try:
        with ctx.app.audit.acting(Actor.cli(by), "signal", run_id=named if isinstance(named, str) else None,
                                  target=event if isinstance(named, str) else f"{run}:{event}") as entry:
            if isinstance(named, str):
                receipt = ctx.app.signal(named, event, value, by=by)
            else:
                receipt = ctx.app.signal(workflow=named[0], business_key=named[1], event=event, payload=value,
                                         by=by)
            entry.run_id = receipt.run_id
    except SasError as exc:
        fail(str(exc))
    click.echo(f"signal {event!r} for run {receipt.run_id}: {receipt.status}")


@click.command("mark-done")
@click.argument("run_id")
@click.argument("step")
@click.option("--result", default=None, help="The step's result, as JSON.")
@operator_options
@pass_ctx
def mark_done(ctx: Context, run_id: str, step: str, result: str | None, by: str, reason: str) -> None:
    """Record a step as done by hand (or skipped); the run goes on with the next one."""
    value = json_option(result, "--result")
    operate(ctx, "mark_done", run_id, by, reason,
            lambda: ctx.app.mark_done(run_id, step, by=by, reason=reason, result=value), step)
    click.echo(done_message("mark_done", run_id, step=step))


@click.command()
@click.argument("run_id")
@operator_options
@pass_ctx
def pause(ctx: Context, run_id: str, by: str, reason: str) -> None:
    """Dispatch no further step of a run until it is resumed."""
    operate(ctx, "pause", run_id, by, reason, lambda: ctx.app.pause(run_id, by=by, reason=reason))
    click.echo(done_message("pause", run_id))


@click.command()
@click.argument("run_id")
@operator_options
@pass_ctx
def resume(ctx: Context, run_id: str, by: str, reason: str) -> None:
    """Resume a paused run."""
    operate(ctx, "resume", run_id, by, reason, lambda: ctx.app.resume(run_id, by=by, reason=reason))
    click.echo(done_message("resume", run_id))


@click.command()
@click.argument("run_id")
@operator_options
@pass_ctx
def cancel(ctx: Context, run_id: str, by: str, reason: str) -> None:
    """Cancel a run: no further step starts and whatever may have been done is undone."""
    state = operate(ctx, "cancel", run_id, by, reason, lambda: ctx.app.cancel(run_id, by=by, reason=reason))
    click.echo(done_message("cancel", run_id, state=state))


@click.command()
@click.argument("run_id")
@operator_options
@pass_ctx
def compensate(ctx: Context, run_id: str, by: str, reason: str) -> None:
    """Undo a processing run, or a run in error, now."""
    operate(ctx, "compensate", run_id, by, reason, lambda: ctx.app.compensate(run_id, by=by, reason=reason))
    click.echo(done_message("compensate", run_id))


@click.command()
@click.argument("run_id")
@click.option("--from", "from_step", required=True, metavar="STEP",
              help="The step to run again from; the steps it waits for keep their results.")
@operator_options
@pass_ctx
def rerun(ctx: Context, run_id: str, from_step: str, by: str, reason: str) -> None:
    """Start a run that has ended again, on the workflow deployed now, from a step: what that step
    waits for keeps its results; it and the rest run again. Prints the new run's id."""
    started = operate(ctx, "rerun", run_id, by, reason,
                      lambda: ctx.app.rerun(run_id, from_step, by=by, reason=reason), from_step)
    click.echo(done_message("rerun", run_id, new_run=started.id))


@click.command()
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
    from sas_app.interfaces.retention import parse_duration, parse_states
    from sas_app.interfaces.retention import purge as purge_runs

    try:
        seconds, chosen = parse_duration(older_than), parse_states(states)
    except ValueError as exc:
        fail(str(exc))
    if dry_run:
        click.echo(f"would delete {ctx.app.store.count_purgeable(seconds, chosen)} run(s) "
                   f"({', '.join(chosen)}, ended more than {older_than} ago)")
        return
    with ctx.app.audit.acting(Actor.cli(), "purge", target=f"{','.join(chosen)} older than {older_than}"):
        done = purge_runs(ctx.app.store, seconds, chosen, batch=batch)
    rate = done.runs / done.seconds if done.seconds else 0.0
    idle = f"; {done.schedules} idle rate-limit schedule(s)" if done.schedules else ""
    click.echo(f"deleted {done.runs} run(s) and {done.rows} row(s) in all, in {done.seconds:.1f} s "
               f"({rate:.0f} runs/s){idle}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object: ok, and each check.")
@click.option("--late", type=click.FloatRange(min=0), default=None,
              help="Seconds past its due time before something counts as overdue "
                   "[default: SAS_PICKUP_TIMEOUT + 10 x SAS_SUPERVISOR_INTERVAL].")
@click.option("--since", type=click.FloatRange(min=0), default=86400, show_default=True,
              help="Seconds of history read for attempts ended twice.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds the broker and the workers may take to answer.")
@click.option("--repair", is_flag=True, help="Hand live runs with nothing due to the Supervisor first.")
@operator_options
@pass_ctx
def doctor(ctx: Context, as_json: bool, late: float | None, since: float, timeout: float, repair: bool, by: str,
           reason: str) -> None:
    """Check a deployment as the chaos run does: the store, the broker, the Supervisor, the workers
    and their clocks, and that no run is left behind. Exits 0 when every check holds, 1 otherwise."""
    repaired = ctx.app.doctor.repair(by) if repair else []
    checks = ctx.app.doctor.examine(late=late, since=since, timeout=timeout)
    healthy = all(check.ok for check in checks)
    if as_json:
        click.echo(json.dumps({"ok": healthy, "repaired": repaired, "checks": [c.as_dict() for c in checks]}))
    else:
        if repair:
            click.echo(f"handed {len(repaired)} run(s) with nothing due to the Supervisor")
        table = Table("check", "", "found", "example", "detail", "what to do")
        for c in checks:
            state = "ok" if c.ok else "not checked" if c.count is None else "PROBLEM"
            table.add_row(c.name, state, "" if c.count is None else str(c.count), c.example or "", c.detail, c.advice)
        console.print(table)
    sys.exit(0 if healthy else 1)


COMMANDS = [resubmit, signal, mark_done, pause, resume, cancel, compensate, rerun, purge, doctor]
