"""Every code sample of the README and the docs runs, or is checked against what it names (see
tests/processes/samples.py): a sample that no longer works fails CI."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text

from sas_app.testing import Processes, Ready
from sas_app.testing.processes import SAS
from tests.conftest import POSTGRES
from tests.integration.stack import CHECKOUT_PATH
from tests.processes.samples import REPO, Page, commands, pages, shell_problem

pytestmark = pytest.mark.integration  # real processes

PAGES = pages()

#: runs a page's fences in order, in one namespace, as a module named ``sample``
RUNNER = """
import sys
namespace = {"__name__": "sample"}
for line, source in SAMPLES:
    try:
        exec(compile(source, f"{PAGE} (the sample at line {line})", "exec"), namespace)
    except BaseException as exc:
        raise SystemExit(f"{PAGE}, the sample at line {line}: {type(exc).__name__}: {exc}")
"""


@pytest.mark.parametrize("page", [p for p in PAGES if p.files or p.run], ids=lambda p: p.name)
@pytest.mark.timeout(600)  # a worker and beat, the samples, ruff, the page's own tests: each bounded below
def test_each_python_sample_runs(page: Page, tmp_path: Path) -> None:
    for name, source in page.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    deployed = re.search(r"<!-- samples: deploy (\S+) -->", page.path.read_text())
    runner = tmp_path / "run_samples.py"
    runner.write_text(f"PAGE = {page.name!r}\nSAMPLES = {page.run!r}\n" + RUNNER)
    env = {**os.environ, "SAS_HOME": str(tmp_path / "home"), "PYTHONPATH": f"{tmp_path}:{CHECKOUT_PATH}",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("SAS_") or k == "SAS_HOME"}
    if deployed:  # the page's samples submit to its app: its workers and beat run meanwhile
        env["SAS_APP"] = deployed.group(1)
        processes = Processes(tmp_path / "home", env, cwd=tmp_path)
        try:
            processes.sas("worker", "worker", "-c", "2")
            processes.beat()
            done = subprocess.run([sys.executable, str(runner)], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=120)
        finally:
            processes.stop_all()
    else:
        done = subprocess.run([sys.executable, str(runner)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    # the page's samples one after another, as they ran (a fragment may use what one above defined)
    (tmp_path / "samples_in_order.py").write_text("\n".join(source for _, source in page.run))
    checked = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select",
                              "F821,F822,F823", "--output-format", "concise", "."],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, f"{page.name}: names never defined\n{checked.stdout}"
    if any(name.startswith("test_") for name in page.files):
        tested = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                                 "--rootdir", str(tmp_path), str(tmp_path)],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert tested.returncode == 0, tested.stdout[-3000:]


@pytest.mark.parametrize("page", [p for p in PAGES if p.shell], ids=lambda p: p.name)
def test_each_shell_sample_names_what_exists(page: Page) -> None:
    problems = [f"line {line}: `{command}`: {problem}" for line, block in page.shell for command in commands(block)
                if (problem := shell_problem(command))]
    assert problems == [], f"{page.name}:\n" + "\n".join(problems)


#: where a server a sample starts says it is up, by its sas command
HEALTH = {"payment-service": "/health", "warehouse-service": "/health", "dashboard": "/healthz"}
#: what the reader types to set up the environment the tests already run in
SETUP = (["python3", "-m", "venv"], ["python", "-m", "venv"], ["source"])


def on_servers(page: Page) -> bool:
    """The page's steps set up a stack on servers (they export a server's URL)."""
    return any(re.search(r"SAS_(BROKER|DATABASE)_URL=\w+://", block) for _, block, _ in page.steps)


@pytest.mark.parametrize("page", [p for p in PAGES if p.steps and not on_servers(p)], ids=lambda p: p.name)
def test_each_tutorial_step_runs_as_the_reader_types_it(page: Page, tmp_path: Path) -> None:
    type_steps(page, tmp_path)


def test_the_production_steps_run_on_this_machine_s_servers(tmp_path: Path) -> None:
    """The production samples as written, page after page, against the PostgreSQL and Redis on
    127.0.0.1 they name (no other test uses the database `sas` or Redis's database 0): the
    database is dropped before and after each page, Redis's database 0 emptied."""
    pages = [p for p in PAGES if p.steps and on_servers(p)]
    assert {p.name for p in pages} >= {"README.md", "docs/how-to/production-stack.md"}
    fresh = partial(drop_database_and_empty_redis, POSTGRES,
                    os.environ.get("SAS_TEST_REDIS", "redis://127.0.0.1:6379") + "/0")
    for number, page in enumerate(pages):
        fresh()
        try:
            type_steps(page, tmp_path / str(number))
        finally:
            fresh()


def drop_database_and_empty_redis(admin_url: str, redis_url: str) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text('DROP DATABASE IF EXISTS "sas" WITH (FORCE)'))
    finally:
        engine.dispose()
    client = redis.Redis.from_url(redis_url)
    try:
        client.flushdb()
    finally:
        client.close()


def type_steps(page: Page, folder: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAS_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    session = Terminal(page, folder / "folder-0", env)
    try:
        for line, block, new_folder in page.steps:
            if new_folder:
                session.close()
                session = Terminal(page, folder / f"folder-{line}", env)
            for command in commands(block):
                session.type(line, command)
    finally:
        session.close()


class Terminal:
    """One terminal a reader types a page's steps in: a folder (holding the page's files and, as the
    checkout does, ``examples/``), its own SAS_HOME, the variables exported so far, and the
    processes started with ``&``."""

    def __init__(self, page: Page, folder: Path, env: dict[str, str]) -> None:
        folder.mkdir(parents=True)
        (folder / "examples").symlink_to(REPO / "examples")
        for name, source in page.files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(source)
        self.page, self.folder = page, folder
        self.env = {**env, "SAS_HOME": str(folder / ".sas"), "PYTHONPATH": f"{folder}:{CHECKOUT_PATH}"}
        self.processes = Processes(folder / "processes", self.env, cwd=folder)
        self.run_id = ""

    def type(self, line: int, command: str) -> None:
        background = command.endswith("&")
        words = shlex.split(command.rstrip("&").replace("$RUN", self.run_id))
        if any(words[:len(setup)] == setup for setup in SETUP) or "pip" in words[0].rsplit("/", 1)[-1]:
            return
        if words[0] == "export":
            self.env.update(word.split("=", 1) for word in words[1:])
            return
        extra = {}
        while "=" in words[0] and words[0].split("=", 1)[0].isupper():
            name, value = words.pop(0).split("=", 1)
            extra[name] = value
        program = {"sas": SAS, "python": [sys.executable], "createdb": ["createdb"],
                   "pytest": [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]}.get(words[0])
        assert program is not None, f"{self.page.name}, line {line}: cannot run `{command}` here"
        argv = [*program, *words[1:]]
        if background:
            port = words[words.index("--port") + 1] if "--port" in words else None
            ready = (Ready(file=True) if words[:2] in (["sas", "worker"], ["sas", "beat"])
                     else Ready(url=f"http://127.0.0.1:{port}{HEALTH.get(words[1], '/')}") if port else None)
            self.processes.start(f"line-{line}-{len(self.processes.procs)}", argv, ready=ready,
                                 env={**self.env, **extra})
            return
        done = subprocess.run(argv, cwd=self.folder, env={**self.processes.env, **self.env, **extra},
                              capture_output=True, text=True, timeout=120)
        said = done.stdout[-2000:] + done.stderr[-2000:]
        assert done.returncode == 0, f"{self.page.name}, line {line}: `{command}`\n{said}"
        if words[:2] == ["sas", "submit"]:
            self.run_id = done.stdout.split()[0]

    def close(self) -> None:
        self.processes.stop_all()
