"""Producers that have only the broker, and first use: a Celery app that imports nothing but
``celery`` (and :class:`sas_app.Producer`) submits runs that real workers process; the embedded
default needs no ``sas migrate`` (the signup example's own "Run it" lines on a fresh SAS_HOME); a
worker on a server database without its schema stops with one line naming ``sas migrate``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from sas_app.testing.processes import Processes
from tests.integration.stack import CHECKOUT_PATH, SAS
from tests.support import wait_for

pytestmark = pytest.mark.integration

APP = {"SAS_APP": "tests.integration.graph_app:sas"}


def only_the_broker(broker_url: str, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a process whose environment holds the broker's URL and nothing of sas_app."""
    env = {"PATH": os.environ["PATH"], "BROKER_URL": broker_url}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, cwd="/", capture_output=True,
                          text=True, timeout=60)


@pytest.mark.both_brokers
def test_a_process_with_only_the_broker_submits_runs_that_are_processed(stack, app, stack_env):
    stack.worker("all", "sas.scheduler,sas.supervisor,sas.agent.work", 2, env=APP)
    celery_only = only_the_broker(stack_env["SAS_BROKER_URL"], """
        import os, sys
        from celery import Celery
        app = Celery(broker=os.environ["BROKER_URL"])
        app.conf.task_queue_max_priority = 9
        app.send_task("sas.submit", queue="sas.scheduler",
                      kwargs={"workflow": "three_at_once", "payload": {}, "business_key": "celery-only"})
        print(sorted(m for m in sys.modules if m.startswith(("sas_app", "sqlalchemy", "psycopg"))))
    """)
    assert celery_only.returncode == 0, celery_only.stderr
    assert celery_only.stdout.strip() == "[]", "the producer imported nothing of sas_app or a database driver"
    producer = only_the_broker(stack_env["SAS_BROKER_URL"], """
        import os, sys
        from sas_app import Producer
        Producer(os.environ["BROKER_URL"]).submit("three_at_once", {}, business_key="producer")
        print(sorted(m for m in sys.modules if m.startswith(("psycopg", "workers", "tests"))))
    """)
    assert producer.returncode == 0, producer.stderr
    assert producer.stdout.strip() == "[]", "no database driver, no workflow code"
    for key in ("celery-only", "producer"):
        run = wait_for(lambda key=key: app.store.find_run("three_at_once", key), 30, f"run {key} to be written")
        assert app.handle(run.id).wait(30).process_state == "processed"


@pytest.mark.both_brokers
def test_a_worker_that_takes_only_signed_work_refuses_the_rest_and_says_so_in_the_trail(stack, app, stack_env):
    key = "billing:" + "k" * 40
    trust = {**APP, "SAS_BROKER_TRUST": "signed", "SAS_BROKER_KEYS": key}
    stack.worker("all", "sas.scheduler,sas.supervisor,sas.agent.work", 2, env=trust)
    sent = only_the_broker(stack_env["SAS_BROKER_URL"], f"""
        import os
        from celery import Celery
        from sas_app import Producer
        Producer(os.environ["BROKER_URL"], signing_key={key!r}).submit("three_at_once", {{}}, business_key="signed")
        app = Celery(broker=os.environ["BROKER_URL"])
        app.conf.task_queue_max_priority = 9
        app.send_task("sas.submit", queue="sas.scheduler",
                      kwargs={{"workflow": "three_at_once", "payload": {{}}, "business_key": "unsigned"}})
    """)
    assert sent.returncode == 0, sent.stderr
    run = wait_for(lambda: app.store.find_run("three_at_once", "signed"), 30, "the signed run to be written")
    assert app.handle(run.id).wait(30).process_state == "processed"
    refused = wait_for(lambda: app.store.audit_rows(via="broker"), 30, "the unsigned submission's refusal")
    assert [(r.actor, r.action, r.target, r.outcome, r.refusal) for r in refused] == [
        ("unsigned", "submit", "three_at_once:unsigned", "refused", "the message is not signed")]
    assert app.store.find_run("three_at_once", "unsigned") is None


def test_the_signup_example_runs_as_its_docstring_says_on_a_fresh_embedded_home(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAS_")}
    env.update({"SAS_HOME": str(tmp_path / "fresh"), "SAS_APP": "examples.signup:sas", "PYTHONPATH": CHECKOUT_PATH,
                "SAS_SUPERVISOR_INTERVAL": "0.5"})
    procs = Processes(tmp_path / "procs", env, cwd=tmp_path)
    try:
        procs.worker("worker", "sas.scheduler,sas.supervisor,sas.agent.accounts,sas.agent.mailer", 2, wait=False)
        procs.beat("beat", wait=False)
        procs.wait_ready()
        done = subprocess.run([sys.executable, "-m", "examples.signup", "alice@example.com"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.startswith("processed")
        logs = procs.log("worker") + procs.log("beat")
        assert "no such table" not in logs and "Traceback" not in logs + done.stderr
    finally:
        procs.stop_all(grace=5)


def test_a_worker_on_a_server_store_without_its_schema_stops_with_one_clear_line(stack_env, db_url):
    env = {**os.environ, **stack_env, **APP, "SAS_DATABASE_URL": db_url}  # a fresh database, never migrated
    done = subprocess.run([SAS, "worker", "-Q", "sas.scheduler,sas.supervisor"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0
    assert "sas worker: the state store has no schema yet: run `sas migrate`" in done.stderr
    assert "Traceback" not in done.stderr
