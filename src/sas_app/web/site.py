"""What ``sas dashboard`` serves: the HTTP API under ``/api/`` and the dashboard everywhere else,
one WSGI application. Each keeps its own authentication: the API's tokens are never asked for a
dashboard password, nor a dashboard's forms for a token. ``/healthz`` (ready: the state store and
its schema answer) and ``/livez`` (the process serves) answer anyone: they are a probe's, and say
nothing of the runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sas_app.errors import one_line
from sas_app.store.migrate import schema_problem
from sas_app.web.api import create_api
from sas_app.web.dashboard import create_dashboard

if TYPE_CHECKING:
    from sas_app.app import SasApp


def create_site(sas: SasApp, *, threads: int = 4, **dashboard: Any) -> Any:
    """The WSGI application; ``dashboard``: :func:`create_dashboard`'s options. Half the server's
    ``threads`` may wait for runs to end at once (``GET /api/v1/runs/{id}/wait``; none on a server
    of one thread, which they would hold)."""
    api = create_api(sas, waits=threads // 2)
    pages = create_dashboard(sas, **dashboard)

    def health(start_response: Any, live: bool) -> Iterable[bytes]:
        problem = None
        if not live:
            try:
                problem = schema_problem(sas.store.engine)
            except Exception as exc:  # the store does not answer: not ready
                problem = f"the state store does not answer: {one_line(exc)}"
        start_response("503 Service Unavailable" if problem else "200 OK",
                       [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")])
        return [f"{problem or 'ok'}\n".encode()]

    def site(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO", ""))
        if path in ("/healthz", "/livez"):
            return health(start_response, live=path == "/livez")
        target = api if path.startswith("/api/") else pages
        return target(environ, start_response)

    return site
