"""Schema migrations, settings from the environment and fault points."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import delete, insert, inspect, select

from sas_app import SasApp, Settings, fault_points, migrate
from sas_app.store import Store
from sas_app.store.migrate import SCHEMA_HEAD, alembic_config, schema_problem
from sas_app.store.schema import metadata
from sas_app.store.tables import events


@pytest.mark.both_stores
def test_migrations_build_exactly_the_models_schema_and_can_run_again(db_url):
    migrate(db_url)
    migrate(db_url)
    store = Store(db_url)
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert schema_problem(store.engine) is None  # the store at the newest migration is what this code needs
    store.dispose()
    assert diff == []


def test_an_embedded_store_upgraded_keeps_its_events_and_never_gives_an_id_twice(tmp_path):
    """Revision 0025 builds SQLite's events table again with AUTOINCREMENT: the events keep their
    ids, and once the newest are deleted (a purge) the next one takes a new id, not theirs."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrate(url, "0024")
    store = Store(url)
    row = {"run_id": "r-1", "kind": "transition", "at": 1.0}
    try:
        with store.engine.begin() as conn:
            conn.execute(insert(events), [row, row, row])
        migrate(url)
        with store.engine.begin() as conn:
            assert list(conn.execute(select(events.c.id).order_by(events.c.id)).scalars()) == [1, 2, 3]
            conn.execute(delete(events).where(events.c.id >= 2))
            conn.execute(insert(events), [row])
            assert list(conn.execute(select(events.c.id).order_by(events.c.id)).scalars()) == [1, 4]
            assert [i["name"] for i in inspect(conn).get_indexes("events")] == ["ix_events_run"]
    finally:
        store.dispose()


def test_the_revision_every_process_checks_its_store_against_is_the_newest_migration():
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert SCHEMA_HEAD == head, f"a migration was added: set SCHEMA_HEAD in sas_app/store/migrate.py to {head!r}"


def test_settings_come_from_the_environment_with_clear_errors():
    s = Settings.from_env({"SAS_SUPERVISOR_INTERVAL": "0.5", "SAS_TASK_EVENTS": "no",
                           "SAS_DATABASE_URL": "postgresql+psycopg2://db/x"})
    assert (s.supervisor_interval, s.task_events, s.database_url) == (0.5, False, "postgresql+psycopg2://db/x")
    assert Settings.from_env({}).database_url.startswith("sqlite:///")
    with pytest.raises(ValueError, match="SAS_SWEEP_BATCH='many' is not a valid int"):
        Settings.from_env({"SAS_SWEEP_BATCH": "many"})
    with pytest.raises(ValueError, match="supervisor_interval must be positive"):
        Settings.from_env({"SAS_SUPERVISOR_INTERVAL": "0"})
    with pytest.raises(ValueError, match="at_risk_interval must be positive"):
        Settings.from_env({"SAS_AT_RISK_INTERVAL": "-1"})
    limits = Settings.from_env({"SAS_AGENT_RATE_LIMITS": "payment=20/s, warehouse=5/m"})
    assert (limits.rate_limit("payment"), limits.rate_limit("warehouse"), limits.rate_limit("other")) == \
        ("20/s", "5/m", None)
    with pytest.raises(ValueError, match="is not agent=limit"):
        Settings.from_env({"SAS_AGENT_RATE_LIMITS": "payment"}).rate_limit("payment")


def test_celery_gets_the_reliability_defaults(sas):
    conf = sas.celery.conf
    assert conf.accept_content == ["json"] and conf.task_serializer == "json"
    assert conf.worker_prefetch_multiplier == 1
    assert conf.broker_transport_options["visibility_timeout"] == sas.settings.visibility_timeout
    agent_task = sas.celery.tasks["sas.agent.svc.work"]
    assert agent_task.acks_late and agent_task.reject_on_worker_lost
    assert conf.beat_schedule["sas.supervisor.sweep"]["options"]["queue"] == "sas.supervisor"
    # the at-risk looks are taken by the Supervisor's workers themselves, not sent through the broker
    assert "sas.supervisor.watch" not in conf.beat_schedule
    assert sas.supervisor.forecast.lookout.every == sas.settings.at_risk_interval


def test_fault_points_fire_only_when_armed_and_once_when_asked(tmp_path):
    try:
        fault_points.hit("agent.after_call")  # nothing armed: no effect
        with pytest.raises(ValueError, match="unknown fault point"):
            fault_points.arm("agent.nowhere=kill")
        fault_points.arm("agent.after_call=raise@once", tmp_path)
        with pytest.raises(fault_points.FaultInjected):
            fault_points.hit("agent.after_call")
        fault_points.hit("agent.after_call")  # once: the marker exists now
        fault_points.hit("scheduler.after_commit")
    finally:
        fault_points.arm("")


def test_a_deployments_own_celery_settings_apply_over_sas_apps(settings, tmp_path, monkeypatch):
    (tmp_path / "deploycfg.py").write_text(
        "from datetime import timedelta\n\nworker_max_memory_per_child = 1234\nresult_expires = timedelta(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    app = SasApp(settings, celery_config="deploycfg")

    assert app.celery.conf.worker_max_memory_per_child == 1234
    assert app.celery.conf.task_serializer == "json" and app.celery.conf.worker_prefetch_multiplier == 1
    assert "timedelta" not in app.celery.conf  # imported names are not settings
    assert SasApp(settings, celery_config="no_such_config_module").celery.conf.accept_content == ["json"]
