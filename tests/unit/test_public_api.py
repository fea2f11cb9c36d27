"""What a user's code sees of sas_app: its public names only, with their types.

The examples and the order example are user code: they import only names ``sas_app`` and
``sas_app.testing`` export (a private module there is a name a user would copy). Their types:
tests/processes/test_typing.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sas_app
import sas_app.testing

REPO = Path(__file__).resolve().parents[2]
#: the public packages and the names each exports
PUBLIC = {"sas_app": set(sas_app.__all__), "sas_app.testing": set(sas_app.testing.__all__)}


def imports_of(path: Path) -> list[tuple[str, str | None]]:
    """Each ``(module, name)`` a file imports from sas_app (name None for ``import module``)."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sas_app":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] == "sas_app"]
    return found


@pytest.mark.parametrize("path", sorted(
    str(p.relative_to(REPO)) for folder in ("examples", "src/workers") for p in (REPO / folder).glob("*.py")))
def test_user_code_imports_only_sas_app_s_public_names(path):
    private = [f"{module}.{name}" if name else module for module, name in imports_of(REPO / path)
               if name not in PUBLIC.get(module, ())]
    assert private == [], f"{path} imports what sas_app does not export"


def test_a_run_state_says_whether_the_run_has_finished():
    """What a progress bar or a "lost" count goes by: the states a run never leaves on its own."""
    assert [state for state in sas_app.RunState if state.finished] == [
        sas_app.RunState.PROCESSED, sas_app.RunState.ERROR, sas_app.RunState.COMPENSATED, sas_app.RunState.CANCELLED]


def test_the_readme_s_test_kit_example_is_a_test_the_examples_run():
    """The README's test is examples/test_signup.py's own, as it is there."""
    readme = (REPO / "README.md").read_text()
    shown = readme.split("### Test it in milliseconds", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    test_file = (REPO / "examples" / "test_signup.py").read_text()
    imports, _, test = shown.partition("\n\n\ndef ")
    imported = {(node.module, alias.name) for node in ast.walk(ast.parse(test_file))
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    shown_imports = {(node.module, alias.name) for node in ast.walk(ast.parse(imports))
                     if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert shown_imports <= imported, "the README imports only what the test imports"
    assert "def " + test in test_file, "the README's test is examples/test_signup.py's, as it is there"


def test_every_word_of_a_run_s_history_is_exported_by_sas_app():
    """The states reference (docs/hooks.py's ``states_tables``) lists the enums a run's rows and
    events are written in, as exported by ``sas_app``: a user filtering a run's events by kind
    imports ``EventKind`` from there."""
    import sas_app.states

    for name in ("RunState", "StepState", "EventKind", "Cause", "SignalStatus"):
        assert name in PUBLIC["sas_app"], name
        assert getattr(sas_app, name) is getattr(sas_app.states, name)
