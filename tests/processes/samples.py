"""The code samples of the README and the docs, as the tests run and check them.

Python: a fence that includes a file (``--8<-- "examples/x.py"``) is that file, run by its own
tests. A fence titled ``title="name.py"`` is written to that file in a folder of the page's own; a
fence with top-level ``def test_…`` becomes a test file there; every other fence is run, in the
page's order and in one namespace (a fragment may build on the fences above it), as a module not
named ``__main__``. Then pytest runs the page's test files, and ruff checks every sample for names
used but never defined (the ``if __name__ == "__main__":`` parts are not run).

Shell: each command is checked against what it names: a ``sas`` command is parsed by the real
``sas`` (click, without running it), ``python -m`` names a module that exists, ``bash`` a file of the
repository, ``pip install`` extras that exist, and every ``SAS_*`` variable set is a setting. The
steps a tutorial has the reader type (a fence after ``<!-- run -->``) are run too, in order, as in
one terminal: ``&`` starts a process that runs until the page ends, ``export`` holds for the
commands after it, ``$RUN`` is the id the last ``sas submit`` printed; ``<!-- run: new folder -->``
starts again in a folder of its own. Their setup (a virtual environment, ``pip install``) is the
one the tests run in.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path

import click

from sas_app import Settings
from sas_app.cli import main

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.M | re.S)
#: variables the samples may set that are not settings: the app, the kit's database, the example's services
OTHER_VARIABLES = {"SAS_APP", "SAS_TEST_DATABASE_URL", "PAYMENT_SERVICE_URL", "WAREHOUSE_SERVICE_URL",
                   "REDIS_PASSWORD", "POSTGRES_PASSWORD", "RUN"}
#: programs a shell sample may name that are not the project's (they are checked by their own makers)
PROGRAMS = {"createdb", "psql", "docker", "rabbitmqctl", "source", "curl", "celery", "mkdocs", "cd", "mkdir",
            "kill", "pytest", "open", "redis-cli", "pgbouncer", "export", "kubectl"}


@dataclass
class Page:
    path: Path
    files: dict[str, str] = field(default_factory=dict)  # written to the page's folder
    run: list[tuple[int, str]] = field(default_factory=list)  # (line, source), run in order
    shell: list[tuple[int, str]] = field(default_factory=list)
    #: the fences a tutorial has the reader type, in order: (line, source, in a new folder)
    steps: list[tuple[int, str, bool]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.path.relative_to(REPO))


def pages() -> list[Page]:
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        page = Page(path)
        text = path.read_text()
        for number, match in enumerate(FENCE.finditer(text)):
            language, info, body = match.groups()
            line = text.count("\n", 0, match.start()) + 1
            title = re.search(r'title="([^"]+)"', info)
            if language == "python" and "--8<--" not in body:
                if title:
                    page.files[title.group(1)] = body
                elif re.search(r"^def test_", body, re.M):
                    page.files[f"test_sample_{number}.py"] = body
                else:
                    page.run.append((line, body))
            elif language == "bash":
                page.shell.append((line, body))
                marker = re.search(r"<!-- run(: new folder)? -->\n$", text[:match.start()])
                if marker:
                    page.steps.append((line, body, marker.group(1) is not None))
        if page.files or page.run or page.shell:
            found.append(page)
    return found


def commands(block: str) -> list[str]:
    """The commands of a shell sample: continuation lines joined, comments dropped; a command run
    in the background keeps its ``&``."""
    joined = re.sub(r"\\\n\s*", " ", block)
    found = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            found += [part.strip() for part in re.split(r"\s*(?:&&|;)\s*", line) if part.strip()]
    return found


def shell_problem(command: str) -> str | None:
    """What is wrong with one shell command of a sample, or None."""
    words = shlex.split(command.rstrip("&").replace("…", "x"))
    settings = {f"SAS_{f.name.upper()}" for f in fields(Settings)}
    while (words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0])) or words[:1] == ["export"]:
        if words[0] != "export":
            variable = words[0].split("=", 1)[0]
            if variable.startswith("SAS_") and variable not in settings | OTHER_VARIABLES:
                return f"{variable} is not a setting"
        words = words[1:]
    if not words:
        return None
    program, args = words[0].rsplit("/", 1)[-1], words[1:]
    if program == "sas":
        try:
            with main.make_context("sas", list(args)) as ctx:
                # the first word that names a command; what follows it is that command's
                at = next((i for i, word in enumerate(args) if main.get_command(ctx, word) is not None), None)
                if at is not None:
                    main.get_command(ctx, args[at]).make_context(args[at], args[at + 1:], parent=ctx).close()
        except click.exceptions.Exit:
            return None
        except click.ClickException as exc:
            return f"sas refuses it: {exc.format_message()}"
        return None
    if program.startswith("python") and args[:1] == ["-m"]:
        module = args[1]
        if module in ("venv", "pip", "pytest", "mkdocs") or importlib.util.find_spec(module) is not None:
            return None
        return f"no module {module}"
    if program == "bash":
        return None if (REPO / args[0]).exists() else f"no file {args[0]}"
    if program == "pip":
        extras = set(importlib.metadata.metadata("sas_app").get_all("Provides-Extra") or [])
        asked = {e for arg in args for e in re.findall(r"\[([^\]]+)\]", arg) for e in e.split(",")}
        return None if asked <= extras else f"no extra {sorted(asked - extras)}"
    return None if program in PROGRAMS else f"{program} is not a command the samples may name"
