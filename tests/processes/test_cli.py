"""The ``sas`` command as a user runs it: a subprocess on the embedded default (no servers)."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sas_app import Settings
from sas_app.store import Store
from tests.integration.stack import CHECKOUT_PATH

pytestmark = pytest.mark.integration  # real processes

SAS = str(Path(sys.executable).parent / "sas")


@pytest.fixture
def sas_cli(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAS_")}
    # No worker runs here: submit only asks the Scheduler (by message), so runs stay pending.
    env.update({"SAS_HOME": str(tmp_path / "home"), "PYTHONPATH": CHECKOUT_PATH, "SAS_INLINE_REPLIES": "false"})

    def run(*args: str, ok: bool = True, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([SAS, *args], capture_output=True, text=True, env={**env, **(extra_env or {})},
                                cwd=tmp_path, timeout=60)
        if ok:
            assert result.returncode == 0, result.stderr
        return result

    return run


def test_migrate_submit_list_and_show(sas_cli, tmp_path):
    assert "schema is up to date" in sas_cli("migrate").stdout
    run_id = sas_cli("submit", "order", "--key", "cli-1", "--payload", '{"amount": 4.5}').stdout.strip()
    again = sas_cli("submit", "order", "--key", "cli-1", "--payload", '{"amount": 4.5}').stdout.strip()
    assert again == run_id and len(run_id) == 32

    [listed] = json.loads(sas_cli("runs", "--json").stdout)
    assert (listed["id"], listed["business_key"], listed["process_state"]) == (run_id, "cli-1", "pending")
    shown = json.loads(sas_cli("show", run_id, "--json").stdout)
    assert [(s["name"], s["waits_for"]) for s in shown["steps"]] == [
        ("reserve_stock", []), ("fraud_check", []), ("charge_payment", [0, 1]), ("schedule_shipping", [2]),
        ("confirm_order", [3])]
    assert shown["version"] and [r["id"] for r in json.loads(
        sas_cli("runs", "--json", "--version", shown["version"]).stdout)] == [run_id]
    assert json.loads(sas_cli("runs", "--json", "--version", "nope").stdout) == []
    assert json.loads(sas_cli("runs", "--json", "--failure", "payment").stdout) == []  # it has not failed
    assert shown["events"][0]["to_state"] == "pending"
    assert "charge_payment" in sas_cli("show", run_id).stdout
    assert json.loads(sas_cli("show", "order:cli-1", "--json").stdout)["id"] == run_id  # WORKFLOW:BUSINESS_KEY
    # what users and services wrote is shown as written, never read as the terminal's markup
    sas_cli("submit", "order", "--key", "odd-[/tmp]", "--payload", '{"amount": 1}')
    assert "key=odd-[/tmp]" in sas_cli("show", "order:odd-[/tmp]").stdout
    assert "odd-[/tmp]" in sas_cli("runs").stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"], "the embedded broker writes only under SAS_HOME"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "nope"], "error: no run with id 'nope'"),
        (["show", "order:nope"], "error: no run of workflow 'order' with business key 'nope'"),
        (["submit", "order", "--key", "k", "--payload", "{not json"], "error: --payload is not valid JSON"),
        (["submit", "nope", "--key", "k"], "error: unknown workflow 'nope'"),
        (["submit", "order", "--key", "k", "--payload", '{"amount": -1}'], "positive 'amount'"),
        (["runs", "--state", "bogus"], "Invalid value for '--state'"),
        (["worker", "-Q", "sas.nowhere"], "error: unknown queue(s) sas.nowhere"),
        (["--app", "no.such.module:sas", "runs"], "error: cannot import the app module 'no.such.module'"),
        (["--app", "tests.integration.graph_app:sas", "worker", "-P", "gevent", "-Q", "sas.agent.work"],
         "error: work.fetch is async def, run on each worker thread's event loop, which the gevent pool does not"),
    ],
)
def test_errors_exit_non_zero_with_one_line_and_no_traceback(sas_cli, args, message):
    sas_cli("migrate")
    result = sas_cli(*args, ok=False)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_operator_commands_act_and_record_who_and_why(sas_cli, tmp_path):
    sas_cli("migrate")
    run_id = sas_cli("submit", "order", "--key", "op-1", "--payload", '{"amount": 2}').stdout.strip()

    assert "paused" in sas_cli("pause", run_id, "--by", "ann", "--reason", "checking").stdout
    assert "resumed" in sas_cli("resume", run_id, "--by", "ann").stdout
    assert f"run {run_id} cancelled" in sas_cli("cancel", run_id, "--by", "ann", "--reason", "duplicate order").stdout

    shown = json.loads(sas_cli("show", run_id, "--json").stdout)
    assert shown["process_state"] == "cancelled" and shown["cancelled_by"] == "ann"
    actions = [(e["detail"]["action"], e["detail"]["by"]) for e in shown["events"] if e["kind"] == "operator"]
    assert actions == [("pause", "ann"), ("resume", "ann"), ("cancel", "ann")]

    for args, message in [
        (["resubmit", run_id], "it is cancelled, not error"),
        (["compensate", run_id], "it is cancelled"),
        (["cancel", run_id], "it is cancelled"),
        (["mark-done", run_id, "charge_payment", "--result", "{bad"], "--result is not valid JSON"),
        (["resubmit", "nope"], "no run with id 'nope'"),
    ]:
        result = sas_cli(*args, ok=False)
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr

    store = Store(Settings(home=tmp_path / "home").database_url)  # the trail, as the commands left it
    trail = list(reversed(store.audit_rows()))
    store.dispose()
    user = os.environ.get("USER") or "operator"
    refused = [("resubmit", run_id), ("compensate", run_id), ("cancel", run_id), ("resubmit", "nope")]
    assert [(r.actor, r.via, r.action, r.run_id, r.outcome) for r in trail] == [
        ("ann", "cli", "pause", run_id, "done"), ("ann", "cli", "resume", run_id, "done"),
        ("ann", "cli", "cancel", run_id, "done"), *[(user, "cli", action, run, "refused") for action, run in refused]]
    assert trail[2].reason == "duplicate order" and trail[3].refusal.endswith("it is cancelled, not error")
    assert all(r.origin.startswith(f"{getpass.getuser()}@") and r.role == "admin" for r in trail)


PASSWORD = "s3cret-Pw"


@pytest.mark.parametrize(
    ("database_url", "problem"),
    [
        (f"postgresql+psycopg2://sas:{PASSWORD}@127.0.0.1:1/sas", "Connection refused"),
        (f"postgresql+psycopg2://sas:{PASSWORD}@127.0.0.1:notaport/sas", "invalid literal for int()"),
        (f"nosuchdb://sas:{PASSWORD}@127.0.0.1/sas", "Can't load plugin: sqlalchemy.dialects:nosuchdb"),
    ],
)
@pytest.mark.parametrize("command", [["runs"], ["submit", "order", "--key", "k"], ["migrate"]])
def test_a_store_that_is_down_or_a_bad_url_is_one_line_without_the_password(sas_cli, database_url, problem, command):
    result = sas_cli(*command, ok=False, extra_env={"SAS_DATABASE_URL": database_url})

    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and problem in line
    assert PASSWORD not in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_a_store_never_migrated_says_to_migrate_but_the_embedded_default_needs_no_migrate(sas_cli, tmp_path):
    elsewhere = {"SAS_DATABASE_URL": f"sqlite:///{tmp_path / 'elsewhere.db'}"}  # as a server database is
    result = sas_cli("runs", ok=False, extra_env=elsewhere)
    assert result.returncode == 2
    assert "no such table: runs; run `sas migrate` first" in result.stderr
    assert sas_cli("runs", "--json").stdout.strip() == "[]"  # the embedded default: created on first use


def test_a_broker_that_is_down_leaves_the_run_stored_for_the_supervisor(sas_cli):
    # Celery's own retries give up, the run is written: a Supervisor will start it. The password
    # of the broker's URL shows nowhere.
    sas_cli("migrate")
    broker = {"SAS_BROKER_URL": f"redis://:{PASSWORD}@127.0.0.1:1/0"}
    result = sas_cli("submit", "order", "--key", "k-1", "--payload", '{"amount": 1}', extra_env=broker)
    assert PASSWORD not in result.stdout + result.stderr
    assert sas_cli("runs", "--json").stdout.count('"pending"') == 1


def test_the_dashboard_refuses_a_store_whose_schema_is_behind_and_says_to_migrate(sas_cli, tmp_path):
    from alembic.script import ScriptDirectory

    from sas_app.store.migrate import alembic_config, migrate

    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"  # not the embedded default: as a server database is
    never = sas_cli("dashboard", "--port", "1", ok=False, extra_env={"SAS_DATABASE_URL": url})
    assert never.returncode == 2 and "no schema yet: run `sas migrate`" in never.stderr

    migrate(url, "0004")  # as the previous version left it
    behind = sas_cli("dashboard", "--port", "1", ok=False, extra_env={"SAS_DATABASE_URL": url})
    assert behind.returncode == 2
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    assert f"schema is at revision 0004, this sas_app needs {head}: run `sas migrate`" in behind.stderr
    assert "Traceback" not in behind.stderr
    embedded = tmp_path / "home" / "state.db"
    migrate(f"sqlite:///{embedded}", "0004")  # the embedded default is brought up to date on first use
    assert sas_cli("runs", "--json").stdout.strip() == "[]"



def test_flower_off_loopback_needs_credentials(sas_cli):
    refused = sas_cli("flower", "--host", "0.0.0.0", ok=False)
    assert refused.returncode == 2 and "give --basic-auth user:password (or FLOWER_BASIC_AUTH)" in refused.stderr
    bad = sas_cli("flower", "--basic-auth", "just-a-user", ok=False)
    assert bad.returncode == 2 and "--basic-auth: basic auth must be user:password" in bad.stderr


def test_purge_deletes_old_finished_runs_and_says_how_many(sas_cli, tmp_path):
    sas_cli("submit", "order", "--key", "p-1", "--payload", '{"amount": 1}')  # pending: never deleted
    assert "would delete 0 run(s)" in sas_cli("purge", "--older-than", "0", "--dry-run").stdout
    assert sas_cli("purge", "--older-than", "1s").stdout.startswith("deleted 0 run(s)")
    assert len(json.loads(sas_cli("runs", "--json").stdout)) == 1
    bad = sas_cli("purge", "--older-than", "a month", ok=False)
    assert bad.returncode == 2 and "'a month' is not a duration" in bad.stderr
    assert "states must be finished ones" in sas_cli("purge", "--older-than", "1d", "--state", "processing",
                                                     ok=False).stderr
    # the purge is in the audit trail; the trail's own purge leaves a row of its own
    assert sas_cli("audit", "--purge-older-than", "0s").stdout.startswith("deleted 1 row(s)")
    store = Store(Settings(home=tmp_path / "home").database_url)
    [purged] = store.audit_rows()
    store.dispose()
    assert (purged.action, purged.target, purged.outcome) == ("audit_purge", "older than 0s", "done")


def test_doctor_on_a_store_that_is_down_names_it_and_checks_nothing_that_needs_it(sas_cli):
    """Exit 1 with the database named (its password masked); the checks that read the store say
    they were not made, rather than failing with a traceback."""
    down = {"SAS_DATABASE_URL": f"postgresql+psycopg2://sas:{PASSWORD}@127.0.0.1:1/sas"}
    result = sas_cli("doctor", "--json", "--timeout", "0.5", ok=False, extra_env=down)
    assert result.returncode == 1, result.stderr
    found = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert found["database"]["count"] == 1 and "OperationalError" in found["database"]["detail"]
    assert found["database"]["example"] == "postgresql+psycopg2://127.0.0.1:1/…"
    assert {name for name, c in found.items() if c["count"] is None} == {
        "schema", "supervisor", "stranded_runs", "overdue", "unsent_notifications", "attempts_ended_twice", "clocks"}
    assert found["broker"]["ok"] and found["workers"]["count"] == 6  # the embedded broker: nobody consumes
    assert PASSWORD not in result.stdout + result.stderr and "Traceback" not in result.stderr


def test_a_command_says_which_embedded_store_it_reads_and_when_it_made_it(sas_cli, tmp_path):
    store = tmp_path / "home" / "state.db"
    first = sas_cli("runs", "--json")
    assert first.stdout.strip() == "[]"  # stdout stays the command's own: JSON here
    assert f"sas: the embedded store {store} (new: nothing was stored here before; is SAS_HOME the folder " \
           "you meant?)" in first.stderr
    again = sas_cli("runs")
    assert f"sas: the embedded store {store} (the default under SAS_HOME" in again.stderr
    assert "new:" not in again.stderr
    # a server's store is named by the deployment itself: nothing said
    server = {"SAS_DATABASE_URL": f"sqlite:///{tmp_path / 'server.db'}"}
    sas_cli("migrate", extra_env=server)
    assert "embedded store" not in sas_cli("runs", "--json", extra_env=server).stderr


def test_an_unknown_workflow_names_the_app_loaded_and_how_to_choose_another(sas_cli):
    result = sas_cli("submit", "hotel", "--key", "h-1", ok=False)
    assert result.returncode == 2
    assert "unknown workflow 'hotel'; registered: ['held_order', 'order'] (the app loaded is workers.app:sas " \
           "— the order example, the default; choose yours with --app module:attribute or SAS_APP)" in result.stderr


def test_help_lists_the_commands_by_who_uses_them_the_example_apart(sas_cli):
    text = sas_cli("--help").stdout
    sections = ["Run a deployment:", "Submit and look at runs:", "Operate runs:", "Try it: the order example:"]
    assert [text.index(s) for s in sections] == sorted(text.index(s) for s in sections)
    example = text.split("Try it: the order example:")[1]
    assert all(name in example for name in ("demo", "payment-service", "warehouse-service"))
    operating = text.split("Operate runs:")[1].split("Try it")[0]
    assert "resubmit" in operating and "mark-done" in operating and "demo" not in operating
