"""The public API's types as a user's editor and type checker see them: ``mypy --strict`` on a file
of user-style code (``tests/typed_user_code.py``) keeps the decorators and references typed (an
``assert_type`` there fails the check the day one of them is ``Any``), and each mistake in
``tests/typed_user_mistakes.py`` is a type error where it is made."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # real processes

REPO = Path(__file__).resolve().parents[2]


def test_the_public_api_keeps_its_types_under_mypy_strict():
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental",
         str(REPO / "tests" / "typed_user_code.py")],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_mistakes_in_user_code_are_type_errors_each_where_it_is_made():
    path = REPO / "tests" / "typed_user_mistakes.py"
    marked = sorted(i for i, line in enumerate(path.read_text().splitlines(), 1) if "  # refused:" in line)
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental", str(path)],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    flagged = sorted({int(line.split(":")[1]) for line in checked.stdout.splitlines() if ": error:" in line})
    assert flagged == marked, checked.stdout


def test_a_type_checker_finds_the_installed_package_from_a_project_of_its_own(tmp_path):
    """The tutorial's own workflow is written in a new folder: mypy (and an editor) run there must
    find sas_app as installed — an editable install's import hook is invisible to them, a path is not."""
    user_code = tmp_path / "booking.py"
    user_code.write_text("from sas_app import SasApp\n\nsas = SasApp()\nreveal_type(sas)\n")
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(user_code)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert checked.returncode == 0 and 'Revealed type is "sas_app.app.SasApp"' in checked.stdout, checked.stdout
