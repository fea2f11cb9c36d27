"""``sas`` commands of access: ``token`` (create, list, revoke the HTTP API's tokens) and ``audit``
(read the trail of every action, and purge it on its own retention). Each token change is in the
trail too."""

from __future__ import annotations

import json
from dataclasses import asdict

import click
from rich.table import Table

from sas_app.cli.base import Context, console, fail, pass_ctx
from sas_app.errors import SasError
from sas_app.interfaces.access import DEFAULT_LIFETIME, ROLES, Actor
from sas_app.interfaces.audit import OUTCOMES
from sas_app.interfaces.retention import parse_duration
from sas_app.web.formatting import when


@click.group()
def token() -> None:
    """Create, list and revoke the HTTP API's tokens."""


@token.command("create")
@click.option("--name", required=True, help="Who uses it (a service, a person): shown in the audit trail.")
@click.option("--role", type=click.Choice([r.value for r in ROLES]), required=True,
              help="viewer reads; approver also answers waits; operator also submits and acts on runs; "
                   "admin also manages access.")
@click.option("--expires", default=f"{DEFAULT_LIFETIME / 86400:.0f}d", show_default=True,
              help="How long it lives: 30d, 12h, 90m (at most two years).")
@click.option("--by", default="", help="Who creates it (default: the OS user).")
@pass_ctx
def create(ctx: Context, name: str, role: str, expires: str, by: str) -> None:
    """Create a token and print it: it is shown this once, and kept only as a digest."""
    try:
        lifetime = parse_duration(expires)
    except ValueError as exc:
        fail(f"--expires: {exc}")
    actor = Actor.cli(by)
    try:
        with ctx.app.audit.acting(actor, "token_create", target=name):
            row, secret = ctx.app.tokens.create(name, role, by=actor.name, lifetime=lifetime)
    except SasError as exc:
        fail(str(exc))
    click.echo(secret)
    click.echo(f"token {row.id} for {row.name} ({row.role}), expires {when(row.expires_at)}: "
               "it is not shown again", err=True)


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
@pass_ctx
def list_tokens(ctx: Context, as_json: bool) -> None:
    """Every token, newest first: its id, name, role, who made it, its expiry and revocation."""
    rows = ctx.app.tokens.store.tokens()
    if as_json:
        click.echo(json.dumps([{k: v for k, v in asdict(r).items() if k != "secret_sha256"} for r in rows]))
        return
    table = Table("id", "name", "role", "created by", "created", "expires", "revoked")
    for r in rows:
        table.add_row(r.id, r.name, r.role, r.created_by, when(r.created_at), when(r.expires_at),
                      f"{when(r.revoked_at)} by {r.revoked_by}" if r.revoked_at else "")
    console.print(table)


@token.command("revoke")
@click.argument("token_id")
@click.option("--by", default="", help="Who revokes it (default: the OS user).")
@click.option("--reason", default="", help="Why (in the audit trail).")
@pass_ctx
def revoke(ctx: Context, token_id: str, by: str, reason: str) -> None:
    """Revoke a token, named by its id or its (live) name: refused from then on."""
    actor = Actor.cli(by)
    try:
        with ctx.app.audit.acting(actor, "token_revoke", target=token_id, reason=reason):
            row = ctx.app.tokens.revoke(token_id, by=actor.name)
    except SasError as exc:
        fail(str(exc))
    click.echo(f"token {row.id} ({row.name}) revoked")


@click.command()
@click.option("--actor", default=None, help="Only actions by this user or token (a prefix).")
@click.option("--action", default=None, help="Only this action: submit, signal, cancel, token_create, ...")
@click.option("--run", "run_id", default=None, help="Only actions on this run.")
@click.option("--outcome", type=click.Choice(OUTCOMES), default=None)
@click.option("--via", type=click.Choice(("cli", "api", "dashboard", "broker")), default=None)
@click.option("--since", default=None, help="Only the last 30d, 12h, 90m...")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--purge-older-than", "purge", default=None, metavar="DURATION",
              help="Instead: delete the trail's rows older than this (its own retention, e.g. 400d).")
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
@pass_ctx
def audit(ctx: Context, actor: str | None, action: str | None, run_id: str | None, outcome: str | None,
          via: str | None, since: str | None, limit: int, purge: str | None, as_json: bool) -> None:
    """The audit trail, newest first: who did what, on which run, why, from where, and whether it
    was done or refused."""
    store = ctx.app.store
    try:
        ago = parse_duration(since) if since else None
        older = parse_duration(purge) if purge else None
    except ValueError as exc:
        fail(str(exc))
    if older is not None:
        total = 0
        with ctx.app.audit.acting(Actor.cli(), "audit_purge", target=f"older than {purge}"):
            while deleted := store.purge_audit(older, 10_000):
                total += deleted
        click.echo(f"deleted {total} row(s) of the audit trail older than {purge}")
        return
    rows = store.audit_rows(actor=actor, action=action, run_id=run_id, outcome=outcome, via=via,
                            since=None if ago is None else store.now() - ago, limit=limit)
    if as_json:
        click.echo(json.dumps([asdict(r) for r in rows]))
        return
    table = Table("at", "who", "via", "action", "run", "target", "reason", "outcome")
    for r in rows:
        table.add_row(when(r.at), f"{r.actor} ({r.role})", f"{r.via} {r.origin}", r.action, r.run_id or "",
                      r.target or "", r.reason, r.outcome + (f": {r.refusal}" if r.refusal else ""))
    console.print(table)


COMMANDS = [token, audit]
