"""``sas token`` and ``sas audit`` (in this process, through click's runner, on an embedded store):
a token is shown once and kept as a digest, listed, revoked, and each change is in the trail."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sas_app import SasApp, Settings
from sas_app.cli import main

#: the app the commands load here (``--app tests.unit.test_access_cli:CLI_APP``)
CLI_APP: SasApp | None = None


@pytest.fixture
def sas_cli(tmp_path):
    global CLI_APP
    CLI_APP = SasApp(Settings(home=tmp_path / "home", broker_url="memory://localhost/"))
    CLI_APP.migrate()
    runner = CliRunner()

    def run(*args: str, ok: bool = True):
        result = runner.invoke(main, ["--app", "tests.unit.test_access_cli:CLI_APP", *args])
        if ok:
            assert result.exit_code == 0, result.output
        return result

    yield run
    CLI_APP.store.dispose()


def test_a_token_is_shown_once_kept_as_a_digest_listed_revoked_and_each_change_audited(sas_cli, tmp_path):
    made = sas_cli("token", "create", "--role", "operator", "--name", "billing", "--expires", "30d", "--by", "ann")
    token = made.stdout.strip()
    assert token.startswith("sas_") and "it is not shown again" in made.stderr
    [listed] = json.loads(sas_cli("token", "list", "--json").stdout)
    assert (listed["name"], listed["role"], listed["created_by"], listed["revoked_at"]) == \
        ("billing", "operator", "ann", None)
    assert round((listed["expires_at"] - listed["created_at"]) / 86400) == 30
    assert token.split("_", 2)[2] not in (tmp_path / "home" / "state.db").read_bytes().decode("latin-1")
    for args, message in [(["token", "create", "--role", "root", "--name", "x"], "'root' is not one of"),
                          (["token", "create", "--role", "viewer", "--name", "a b"], "a token's name is 1-100"),
                          (["token", "create", "--role", "viewer", "--name", "x", "--expires", "900d"],
                           "at most 730 days"),
                          (["token", "revoke", "nobody"], "no token with id or live name 'nobody'")]:
        result = sas_cli(*args, ok=False)
        assert result.exit_code == 2 and message in result.output, result.output
    assert f"token {listed['id']} (billing) revoked" in sas_cli("token", "revoke", "billing", "--by", "bo").stdout
    assert "revoked already" in sas_cli("token", "revoke", listed["id"], ok=False).output
    trail = json.loads(sas_cli("audit", "--json").stdout)[::-1]
    assert [(r["actor"], r["action"], r["target"], r["outcome"]) for r in trail if r["outcome"] == "done"] == \
        [("ann", "token_create", "billing", "done"), ("bo", "token_revoke", "billing", "done")]
    assert token not in json.dumps(trail)
    assert [r["action"] for r in json.loads(sas_cli("audit", "--json", "--outcome", "refused").stdout)] == \
        ["token_revoke", "token_revoke", "token_create", "token_create"]
