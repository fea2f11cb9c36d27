"""What every ``sas`` command shares: loading the app (``--app`` / SAS_APP), the context that
holds it, one-line errors (passwords masked), running a Celery command with its exit code, and the
options and JSON arguments the operator commands take."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console

from sas_app.app import SasApp
from sas_app.errors import SasError, one_line
from sas_app.interfaces.access import Actor
from sas_app.settings import Settings, mask_secrets

T = TypeVar("T")

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



class Context:
    def __init__(self, spec: str) -> None:
        self.spec = spec
        self._app: SasApp | None = None

    @property
    def app(self) -> SasApp:
        """The app, loaded on first use. On the embedded default store a line on stderr says
        which file it is (and that it is new, if loading the app created it): the store follows
        SAS_HOME, ``./.sas`` by default, so a command run from another folder reads another store."""
        if self._app is None:
            existed = Settings.from_env().embedded_store_file.exists()
            self._app = load_app(self.spec)
            settings = self._app.settings
            if settings.embedded_store:
                note = ("new: nothing was stored here before; is SAS_HOME the folder you meant?" if not existed
                        else "the default under SAS_HOME; SAS_DATABASE_URL names a server's instead")
                click.echo(f"sas: the embedded store {settings.embedded_store_file} ({note})", err=True)
        return self._app

    def which_app(self) -> str:
        """Which app was loaded, and how to choose another: for errors about what it lacks."""
        example = " — the order example, the default" if self.spec == DEFAULT_APP else ""
        return f"the app loaded is {self.spec}{example}; choose yours with --app module:attribute or SAS_APP"


pass_ctx = click.make_pass_decorator(Context)



def named_run(text: str) -> str | tuple[str, str]:
    """A command's RUN argument: a run id, or ``WORKFLOW:BUSINESS_KEY`` as a (workflow, key) pair."""
    workflow, colon, key = text.partition(":")
    return (workflow, key) if colon else text


def json_option(value: str | None, option: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        fail(f"{option} is not valid JSON: {exc}")


def operator_options(fn: Any) -> Any:
    fn = click.option("--by", default=lambda: os.environ.get("USER") or "operator", show_default="$USER",
                      help="Who is acting (recorded in the run's history).")(fn)
    return click.option("--reason", default="", help="Why (recorded in the run's history).")(fn)


def operate(ctx: Context, action: str, run_id: str, by: str, reason: str, do: Callable[[], T],
            target: str | None = None) -> T:
    """``do()``, an operator's action on ``run_id`` taken from the CLI, in the audit trail under
    ``by`` (and the OS user); refused: its message, exit 1."""
    try:
        with ctx.app.audit.acting(Actor.cli(by), action, run_id=run_id, target=target, reason=reason):
            return do()
    except SasError as exc:
        fail(str(exc))
