"""The dashboard's Audit page: the audit trail, newest first, filtered by who, what, which run,
the door and the outcome — for operators and admins (a viewer or an approver is refused)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlencode

from flask import Blueprint, render_template, request

from sas_app.interfaces.audit import OUTCOMES
from sas_app.web.actions import operator_only

if TYPE_CHECKING:
    from sas_app.app import SasApp

#: the filters the page reads from its query string
FIELDS = ("actor", "action", "run_id", "outcome", "via")


def audit_page(sas: SasApp) -> Blueprint:
    bp = Blueprint("audit", __name__)

    @bp.get("/audit")
    def audit() -> str:
        operator_only()
        chosen = {name: request.args.get(name, "").strip() or None for name in FIELDS}
        if chosen["outcome"] not in (None, *OUTCOMES):
            chosen["outcome"] = None
        limit = min(max(request.args.get("limit", 200, type=int) or 200, 1), 1000)
        before = request.args.get("before", type=int)
        rows = sas.store.audit_rows(**chosen, before_id=before, limit=limit)  # type: ignore[arg-type]
        older = urlencode({**{k: v for k, v in chosen.items() if v}, "limit": limit, "before": rows[-1].id}) \
            if len(rows) == limit else None
        return render_template("audit.html", rows=rows, chosen=chosen, outcomes=OUTCOMES, older=older)

    return bp
