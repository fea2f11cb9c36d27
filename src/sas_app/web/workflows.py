"""The dashboard's workflow pages: the workflows this deployment registered, and for each its
steps (what each waits for, its condition, its undo) and its input's JSON Schema, when it has an
input model (:mod:`sas_app.definitions.inputs`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from flask import Blueprint, abort, render_template

from sas_app.definitions.inputs import input_schema
from sas_app.definitions.steps import action_name
from sas_app.web.formatting import spec_does

if TYPE_CHECKING:
    from sas_app.app import SasApp


def workflow_pages(sas: SasApp) -> Blueprint:
    bp = Blueprint("workflows", __name__)

    @bp.get("/workflows")
    def workflow_list() -> str:
        return render_template("workflows.html", workflows=sorted(sas.workflows.values(), key=lambda w: w.name))

    @bp.get("/workflows/<name>")
    def workflow_page(name: str) -> str:
        workflow = sas.workflows.get(name)
        if workflow is None:
            abort(404, f"no workflow named {name!r} is registered here")
        schema = None if workflow.input is None else json.dumps(input_schema(workflow.input), indent=2)
        steps = [(s, [workflow.specs[i].name for i in waits], action_name(s.compensate) if s.compensate else "")
                 for s, waits in zip(workflow.specs, workflow.waits_for, strict=True)]
        return render_template("workflow.html", workflow=workflow, steps=steps, schema=schema, spec_does=spec_does)

    return bp
