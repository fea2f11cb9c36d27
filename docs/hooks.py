"""The docs' reference pages, generated from the code at build time.

A page holds a marker (``<!-- sas:settings -->``, ``<!-- sas:command-variables -->``,
``<!-- sas:queues -->``, ``<!-- sas:states -->``, ``<!-- sas:tables -->``) that is replaced by a table
read from the code: the settings from the ``#:`` comment above each field of
:class:`sas_app.Settings`, the variables the ``sas`` commands' options read, the queues and task names from
``sas_app.messaging.routing``, the states and event kinds from ``sas_app.states`` (each member's
comment), the tables from the schema's SQLAlchemy metadata. A setting without its comment fails
the build (``mkdocs build --strict`` runs in CI), so the reference cannot fall behind the code.

``<!-- sas:workflow module:attribute -->`` is replaced by that workflow's steps and its input's
JSON Schema, as the dashboard's workflow page shows them.
"""

from __future__ import annotations

import ast
import importlib
import io
import json
import os
import re
import sys
import tempfile
import tokenize
from dataclasses import fields
from enum import Enum
from pathlib import Path
from typing import Any

import click

import sas_app
from sas_app import Settings, states
from sas_app.cli.main import main as sas_command
from sas_app.messaging import routing
from sas_app.store import service_tables, tables
from sas_app.store.schema import metadata
from sas_app.web.formatting import spec_does

PACKAGE = Path(sas_app.__file__).parent
#: the checkout: the package is in its src/, the examples beside it
CHECKOUT = Path(__file__).resolve().parents[1]


def comments(path: Path) -> dict[str, str]:
    """Each name assigned in ``path`` and its comment: the ``#:`` lines just above it, or a ``#``
    comment on its line. A class's own are ``Class.NAME``."""
    source = path.read_text()
    said = {token.start[0]: token.string for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT}
    found: dict[str, str] = {}

    def note(node: ast.stmt, prefix: str) -> None:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        else:
            return
        above, line = [], node.lineno - 1
        while said.get(line, "").startswith("#:"):
            above.insert(0, said[line][2:].strip())
            line -= 1
        trailing = said.get(node.lineno, "")
        text = " ".join(above) or (trailing[1:].strip() if trailing.startswith("#") else "")
        if text:
            found[prefix + name] = text

    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            for inner in node.body:
                note(inner, f"{node.name}.")
        else:
            note(node, "")
    return found


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def settings_table() -> str:
    said = comments(PACKAGE / "settings.py")
    rows = ["| Variable | Type | What it sets |", "| --- | --- | --- |"]
    for field in fields(Settings):
        variable = f"SAS_{field.name.upper()}"
        text = said.get(f"Settings.{field.name}", "")
        if not text.startswith(f"{variable} — "):
            raise ValueError(f"Settings.{field.name} has no '#: {variable} — ...' comment: the reference needs it")
        kind = field.type if isinstance(field.type, str) else field.type.__name__
        rows.append(f"| `{variable}` | `{kind}` | {cell(text.removeprefix(f'{variable} — '))} |")
    return "\n".join(rows)


def command_variables_table() -> str:
    """The environment variables a ``sas`` command reads for one of its options (click's
    ``envvar``), beside ``Settings``: each with its command, option, default and help."""
    ctx = click.Context(sas_command)
    rows = ["| Variable | Command and option | Default | What it sets |", "| --- | --- | --- | --- |"]

    def add(command: click.Command, path: str) -> None:
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.envvar, str):
                default = f"`{param.default}`" if param.default not in (None, "") else "none"
                rows.append(f"| `{param.envvar}` | `{path} {param.opts[0]}` | {default} | {cell(param.help or '')} |")
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None:
                    add(sub, f"{path} {name}")

    add(sas_command, "sas")
    return "\n".join(rows)


def queues_table() -> str:
    said = comments(PACKAGE / "messaging" / "routing.py")
    rows = ["| Name | Kind | What it carries |", "| --- | --- | --- |",
            f"| `{routing.agent_queue('<agent>')}` | queue | an agent's steps and undos, one queue per agent |",
            f"| `{routing.agent_task_name('<agent>', '<action>')}` | task | one action or undo of an agent |"]
    for name in dir(routing):
        value = getattr(routing, name)
        # WATCH names the at-risk look in the ``looks`` table: no message carries it
        if name.isupper() and isinstance(value, str) and value.startswith("sas.") and value != routing.WATCH:
            kind = "queue" if name.endswith("_QUEUE") else "task"
            if name not in said:
                raise ValueError(f"sas_app.messaging.routing.{name} has no '#:' comment: the reference needs it")
            rows.append(f"| `{value}` | {kind} | {cell(said[name])} |")
    return "\n".join(rows)


def states_tables() -> str:
    said = comments(PACKAGE / "states.py")
    parts = []
    for enum in (states.RunState, states.StepState, states.EventKind, states.Cause, states.SignalStatus):
        members: list[Enum] = list(enum)
        parts.append(f"## {enum.__name__}\n\n{(enum.__doc__ or '').strip()}\n")
        parts.append("| Value | Meaning |\n| --- | --- |")
        parts += [f"| `{m.value}` | {cell(said.get(f'{enum.__name__}.{m.name}', ''))} |" for m in members]
        parts.append("")
    return "\n".join(parts)


def tables_reference() -> str:
    said = {**table_comments(Path(tables.__file__)), **table_comments(Path(service_tables.__file__))}
    parts = []
    for table in metadata.sorted_tables:
        parts.append(f"## `{table.name}`\n\n{said.get(table.name, '')}\n")
        parts.append("| Column | Type | Null | Key |\n| --- | --- | --- | --- |")
        for column in table.columns:
            key = "primary" if column.primary_key else ", ".join(
                f"→ {fk.column.table.name}" for fk in column.foreign_keys)
            parts.append(f"| `{column.name}` | `{column.type}` | {'yes' if column.nullable else 'no'} | {key} |")
        indexes = sorted(index.name or "" for index in table.indexes)
        if indexes:
            parts.append("\nIndexes: " + ", ".join(f"`{name}`" for name in indexes))
        parts.append("")
    return "\n".join(parts)


def table_comments(path: Path) -> dict[str, str]:
    """Each ``name = Table(...)`` of ``path`` and the ``#`` comment block above it."""
    lines = path.read_text().splitlines()
    found = {}
    for number, line in enumerate(lines):
        if " = Table(" in line:
            above, i = [], number - 1
            while i >= 0 and lines[i].startswith(("# ", "#: ")):
                above.insert(0, lines[i].split(" ", 1)[1])
                i -= 1
            found[line.split(" = ")[0]] = " ".join(above)
    return found


GENERATED = {"<!-- sas:settings -->": settings_table, "<!-- sas:command-variables -->": command_variables_table,
             "<!-- sas:queues -->": queues_table, "<!-- sas:states -->": states_tables,
             "<!-- sas:tables -->": tables_reference}


WORKFLOW = re.compile(r"<!-- sas:workflow (\S+):(\w+) -->")


def workflow_reference(match: re.Match[str]) -> str:
    """A registered workflow (``module:attribute``): its steps, then its input's JSON Schema."""
    module, attribute = match.groups()
    os.environ.setdefault("SAS_HOME", tempfile.mkdtemp(prefix="sas-docs-"))  # its app's store: not in the repo
    if str(CHECKOUT) not in sys.path:  # the examples are in the checkout, not installed with the package
        sys.path.insert(0, str(CHECKOUT))
    workflow = getattr(importlib.import_module(module), attribute)
    rows = ["| step | after | does | condition |", "| --- | --- | --- | --- |"]
    for spec, waits in zip(workflow.specs, workflow.waits_for, strict=True):
        after = ", ".join(workflow.specs[i].name for i in waits) or "-"
        rows.append(f"| `{spec.name}` | {after} | {cell(spec_does(spec))} | "
                    f"{cell(spec.guard.stored if spec.guard else '')} |")
    out = [f"**`{workflow.name}`** (version `{workflow.run_version}`): {cell(workflow.description)}", "",
           *rows, ""]
    if workflow.input is not None:
        schema = json.dumps(workflow.input.model_json_schema(), indent=2)
        out += [f"Its input, `{workflow.input.__name__}`, as JSON Schema:", "", "```json", schema, "```"]
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: Any) -> str:
    for marker, make in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return WORKFLOW.sub(workflow_reference, markdown)


#: a Sphinx role before a name in a docstring, as mkdocstrings renders it (":class:" then the code)
ROLE = re.compile(r":(?:class|meth|func|data|mod|attr|exc):(?=<code>)")


#: a flag with no default, as mkdocs-click shows it under click 8.3 and later (its ``UNSET``)
NO_DEFAULT = "<td><code>Sentinel.UNSET</code></td>"


def on_page_content(html: str, **_: Any) -> str:
    """The docstrings name things the Sphinx way (``:class:`Workflow```): show the name alone; a
    flag with no default shows an empty cell, not click's marker for it."""
    return ROLE.sub("", html).replace(NO_DEFAULT, "<td></td>")
