"""``sas`` commands that run the processes: ``migrate``, ``worker``, ``beat``, ``flower`` and
``dashboard``."""

from __future__ import annotations

import inspect

import click

from sas_app.cli.base import Context, fail, pass_ctx, run_celery
from sas_app.errors import one_line
from sas_app.messaging.routing import agent_queue
from sas_app.store.migrate import schema_problem


@click.command()
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

@click.command()
@click.option("-Q", "--queues", default=None,
              help="Comma-separated queues to consume (default: all of this app's queues).")
@click.option("-c", "--concurrency", type=int, default=None, help="Worker processes (default SAS_AGENT_CONCURRENCY).")
@click.option("-P", "--pool", default="prefork", show_default=True,
              help="Celery pool: prefork, threads (many async def steps at once), solo.")
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
    coroutines = sorted(action.qualname for agent in app.agents.values() if agent_queue(agent.name) in chosen
                        for action in agent.actions.values() if inspect.iscoroutinefunction(action.fn))
    if coroutines and pool in ("gevent", "eventlet"):
        fail(f"{', '.join(coroutines)} {'is' if len(coroutines) == 1 else 'are'} async def, run on each worker "
             f"thread's event loop, which the {pool} pool does not give: use -P threads (many steps at once) "
             "or prefork")
    argv = ["worker", "-Q", ",".join(chosen), "-P", pool, "-l", loglevel,
            "-c", str(concurrency or app.settings.agent_concurrency), "--without-gossip", "--without-mingle"]
    if hostname:
        argv += ["-n", hostname]
    if app.settings.task_events:
        argv.append("-E")
    run_celery(app, argv)

@click.command()
@click.option("--schedule", default=None, help="Beat's schedule file (default under SAS_HOME).")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@pass_ctx
def beat(ctx: Context, schedule: str | None, loglevel: str) -> None:
    """Run Celery beat, which starts a Supervisor sweep every SAS_SUPERVISOR_INTERVAL seconds."""
    app = ctx.app
    app.settings.home.mkdir(parents=True, exist_ok=True)
    path = schedule or str(app.settings.home / "celerybeat-schedule")
    run_celery(app, ["beat", "-s", path, "-l", loglevel])


LOOPBACK = ("127.0.0.1", "localhost", "::1")


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=5555, show_default=True)
@click.option("--basic-auth", "basic_auth", envvar="FLOWER_BASIC_AUTH", default="",
              help="user:password[,user:password...] (env FLOWER_BASIC_AUTH); required unless on a loopback address.")
@pass_ctx
def flower(ctx: Context, host: str, port: int, basic_auth: str) -> None:
    """Serve Flower for this app: its broker, its task names, its workers' task events (SAS_TASK_EVENTS)."""
    from sas_app.web.people import parse_basic_auth

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


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8080, show_default=True)
@click.option("--basic-auth", "basic_auth", envvar="FLOWER_BASIC_AUTH", default="",
              help="user:password[,user:password...], as Flower's (env FLOWER_BASIC_AUTH). Default: no auth.")
@click.option("--flower-url", envvar="SAS_FLOWER_URL", default="",
              help="Flower's address, for links to each dispatch's task (env SAS_FLOWER_URL).")
@click.option("--roles", envvar="SAS_DASHBOARD_ROLES", default="",
              help="user=role[,user=role...] (env SAS_DASHBOARD_ROLES): viewer, approver, operator or admin; "
                   "a user not named is a viewer. Default: everyone let in is an operator.")
@click.option("--user-header", envvar="SAS_DASHBOARD_USER_HEADER", default="",
              help="Take the user from this header a reverse proxy sets (e.g. X-Forwarded-User), instead of "
                   "basic auth; believed only from --proxy-addresses, and a user --roles does not name is a viewer.")
@click.option("--proxy-addresses", envvar="SAS_DASHBOARD_PROXY_ADDRESSES", default="127.0.0.1,::1",
              show_default=True, help="With --user-header: the proxy's addresses, the only ones its header is "
                                      "believed from (env SAS_DASHBOARD_PROXY_ADDRESSES).")
@click.option("--threads", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--secret", envvar="SAS_DASHBOARD_SECRET", default="",
              help="Signs the forms' CSRF tokens (env SAS_DASHBOARD_SECRET; default: random per process; "
                   "dashboards behind one load balancer need the same).")
@pass_ctx
def dashboard(ctx: Context, host: str, port: int, basic_auth: str, roles: str, user_header: str,
              proxy_addresses: str, flower_url: str, threads: int, secret: str) -> None:
    """Serve the dashboard, the HTTP API (/api/v1, with tokens from sas token create) and the
    Prometheus metrics (/metrics) of the state store. With --basic-auth, runs can be acted on from
    their page."""
    from waitress import serve

    from sas_app.web.api import max_body
    from sas_app.web.people import parse_basic_auth, parse_roles
    from sas_app.web.site import create_site

    try:
        credentials = parse_basic_auth(basic_auth)
    except ValueError as exc:
        fail(f"--basic-auth: {exc}")
    try:
        who = parse_roles(roles)
    except ValueError as exc:
        fail(f"--roles: {exc}")
    if credentials and user_header:
        fail("give --basic-auth or --user-header, not both: the dashboard knows people one way")
    problem = schema_problem(ctx.app.store.engine)
    if problem:
        fail(problem)
    proxies = tuple(filter(None, (a.strip() for a in proxy_addresses.split(","))))
    if user_header and not proxies:
        fail("--user-header needs --proxy-addresses: the addresses its header is believed from")
    app = create_site(ctx.app, threads=threads, basic_auth=credentials, roles=who, user_header=user_header.strip(),
                      proxy_addresses=proxies, flower_url=flower_url, secret=secret)
    click.echo(f"sas dashboard on http://{host}:{port}/" + (" (basic auth)" if credentials else "")
               + f", its API on http://{host}:{port}/api/v1 (tokens: sas token create)", err=True)
    # waitress reads a body before the API has seen the token: no more than the API would take
    serve(app, host=host, port=port, threads=threads, ident="sas-dashboard",
          max_request_body_size=max_body(ctx.app.settings))


COMMANDS = [migrate, worker, beat, flower, dashboard]
