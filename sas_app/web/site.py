"""What ``sas dashboard`` serves: the HTTP API under ``/api/`` and the dashboard everywhere else,
one WSGI application. Each keeps its own authentication: the API's tokens are never asked for a
dashboard password, nor a dashboard's forms for a token."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

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

    def site(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        target = api if str(environ.get("PATH_INFO", "")).startswith("/api/") else pages
        return target(environ, start_response)

    return site
