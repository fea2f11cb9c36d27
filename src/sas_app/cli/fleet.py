"""``sas`` commands for running a fleet: ``health`` (a probe's check of one process), ``backlog``
(what each agent has to do: what its workers scale on) and ``kubernetes`` (the manifests)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from celery.utils.nodenames import host_format
from rich.table import Table

from sas_app.cli.base import Context, console, fail, pass_ctx
from sas_app.interfaces.manifests import ManifestError, Manifests, Options, longest_steps
from sas_app.store.backlog import backlog as read_backlog


@click.command()
@click.option("--worker", default=None, metavar="NODE",
              help="Also check that this worker answers and consumes a queue: its -n, e.g. payment@%h "
                   "(%h: this host's name, as Celery expands it).")
@click.option("--alive", is_flag=True,
              help="Liveness: only check that --worker answers (a broker that is down is not held against it).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Seconds the database (to connect: whole seconds, at least 2), the broker and the "
                   "worker may each take to answer.")
@pass_ctx
def health(ctx: Context, worker: str | None, alive: bool, timeout: float) -> None:
    """A probe's check of one process: the state store answers with this sas_app's schema, the
    broker answers, and --worker answers. Prints one line; exits 0 when healthy, 1 otherwise."""
    if alive and worker is None:
        fail("--alive checks a worker: give --worker NODE too")
    node = host_format(worker) if worker else None
    found = ctx.app.doctor.probe(node, alive=alive, timeout=timeout)
    if found.ok:
        click.echo(f"ok: {found.detail}")
        sys.exit(0)
    words = " ".join(filter(None, [found.example, found.detail]))
    advice = f"; {found.advice}" if found.advice and found.advice not in words else ""
    click.echo(f"unhealthy: {found.name}: {words}{advice}")
    sys.exit(1)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object: each agent's counts.")
@pass_ctx
def backlog(ctx: Context, as_json: bool) -> None:
    """What each agent has to do now, from the state store: steps due to be sent, dispatched (in
    its queue or being worked on), backing off before a retry, and how long the oldest dispatched
    one has waited. Scale an agent's workers on due + dispatched ("outstanding")."""
    app = ctx.app
    rows = read_backlog(app.store, tuple(app.agents))
    if as_json:
        click.echo(json.dumps({"agents": {row.agent: row.as_dict() for row in rows}}))
        return
    table = Table("agent", "due", "dispatched", "outstanding", "retrying", "oldest dispatched (s)")
    for row in rows:
        table.add_row(row.agent, str(row.due), str(row.dispatched), str(row.outstanding), str(row.retrying),
                      f"{row.oldest:.1f}")
    console.print(table)


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    found = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key.strip():
            fail(f"{option} {value!r}: expected NAME=VALUE")
        found[key.strip()] = rest
    return found


@click.command()
@click.option("--image", required=True, help="The container image holding your app and sas_app.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The folder to write the kustomization to (its files are replaced).")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="A setting for every process, added to the ConfigMap (repeat it); the app is loaded "
                   "with it, so a step timeout read from it sets the grace periods.")
@click.option("--concurrency", multiple=True, metavar="AGENT=N",
              help="Worker processes per pod for AGENT (repeat it; default SAS_AGENT_CONCURRENCY).")
@click.option("--replicas", type=click.IntRange(1, 100), default=2, show_default=True,
              help="Pods of the Scheduler and of each agent (KEDA's ScaledObjects change the agents').")
@click.option("--prometheus", default=Options.prometheus, show_default=True,
              help="The Prometheus that KEDA asks for each agent's backlog.")
@click.option("--name", default="sas", show_default=True, help="Prefix of every object's name.")
@click.option("--secret/--no-secret", default=True, show_default=True,
              help="Write secret.yaml with placeholders if OUT has none (never over one), and list it; "
                   "--no-secret: you create the Secret NAME-secrets yourself.")
@pass_ctx
def kubernetes(ctx: Context, image: str, out: Path, env: tuple[str, ...], concurrency: tuple[str, ...],
               replicas: int, prometheus: str, name: str, secret: bool) -> None:
    """Write Kubernetes manifests for this app: a Deployment per agent (its grace period from its
    longest step), the Scheduler, beat, the dashboard and Flower, a migration Job, probes, budgets
    and KEDA ScaledObjects. Apply with kubectl apply -k OUT, the ScaledObjects with kubectl apply -k
    OUT/keda."""
    settings = _pairs(env, "--env")
    before = dict(os.environ)
    os.environ.update(settings)  # while the app is loaded: it is loaded as the pods will load it
    try:
        app = ctx.app
    finally:
        os.environ.clear()
        os.environ.update(before)
    per_agent: dict[str, int] = {}
    for agent, value in _pairs(concurrency, "--concurrency").items():
        if agent not in app.agents:
            fail(f"--concurrency {agent}: no such agent; the app has {', '.join(sorted(app.agents)) or 'none'}")
        if not value.isdigit() or int(value) < 1:
            fail(f"--concurrency {agent}={value}: expected a number of processes >= 1")
        per_agent[agent] = int(value)
    if not name.replace("-", "").isalnum() or not name.islower() or not name[0].isalpha():
        fail(f"--name {name!r}: lower-case letters, digits and '-', starting with a letter (a Kubernetes name)")
    options = Options(image=image, app=ctx.spec, name=name, env=settings, concurrency=per_agent,
                      default_concurrency=app.settings.agent_concurrency, replicas=replicas, prometheus=prometheus,
                      secret=secret)
    try:
        manifests = Manifests(longest_steps(app.agents, app.workflows.values()), options)
    except ManifestError as exc:
        fail(str(exc))
    written = manifests.write(out)
    for path in written:
        click.echo(path)
    if secret and out / "secret.yaml" not in written:
        click.echo(f"{out / 'secret.yaml'} kept as it was (it may hold your passwords)")
        differs = manifests.kept_secret_differs(out)
        if differs:
            click.echo(f"warning: {out / 'secret.yaml'} does not match the manifests: {differs}", err=True)


COMMANDS = [health, backlog, kubernetes]
