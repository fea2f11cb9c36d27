"""Every code sample of the README and the docs runs, or is checked against what it names (see
tests/processes/samples.py): a sample that no longer works fails CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sas_app.testing import Processes
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
def test_each_python_sample_runs(page: Page, tmp_path: Path) -> None:
    for name, source in page.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    deployed = re.search(r"<!-- samples: deploy (\S+) -->", page.path.read_text())
    runner = tmp_path / "run_samples.py"
    runner.write_text(f"PAGE = {page.name!r}\nSAMPLES = {page.run!r}\n" + RUNNER)
    env = {**os.environ, "SAS_HOME": str(tmp_path / "home"), "PYTHONPATH": f"{tmp_path}:{REPO}",
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
