"""The documentation site as CI builds it: ``mkdocs build --strict`` (a broken link, a page
missing from the nav or a reference that does not resolve fails it), its reference holding every
public name, every setting and every command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import click
import pytest

import sas_app
import sas_app.testing
from sas_app import Settings
from sas_app.cli import main

pytestmark = pytest.mark.integration  # real processes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                           capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-4000:]
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text()


def test_the_api_reference_documents_every_public_name(site):
    for package, name in [(sas_app, "reference/api"), (sas_app.testing, "reference/testing")]:
        shown = set(re.findall(rf'id="{re.escape(package.__name__)}\.(\w+)"', page(site, name)))
        assert set(package.__all__) - shown == set(), f"{package.__name__} names missing from {name}"


def test_the_settings_reference_lists_every_setting(site):
    text = page(site, "reference/settings")
    assert [f.name for f in fields(Settings) if f"SAS_{f.name.upper()}" not in text] == []


def test_the_cli_reference_lists_every_command(site):
    text = page(site, "reference/cli")
    commands = main.list_commands(click.Context(main))
    assert len(commands) > 10 and [name for name in commands if f"sas {name}" not in text] == []
    assert "UNSET" not in text  # click's marker for "no default", shown as a default
