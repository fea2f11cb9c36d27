"""RabbitMQ as a broker, what can be checked without one: publisher confirms and priority queues
in the Celery settings (and the producer's, which declares the same queue), and a workflow whose
step could outlive the broker's consumer timeout refused at registration, both numbers named."""

from __future__ import annotations

import pytest

from sas_app import Producer, SasApp, Settings, Step, Workflow, WorkflowDefinitionError
from sas_app.messaging.routing import CONFIRM_TIMEOUT

AMQP = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def rabbit_app(tmp_path):
    app = SasApp(Settings(broker_url=AMQP, home=tmp_path / "home", clock_skew=120))
    app.agent("svc").action(lambda call: {}, name="work")
    yield app
    app.store.dispose()


def test_on_rabbitmq_publishes_are_confirmed_and_queues_take_priorities(rabbit_app, tmp_path):
    conf = rabbit_app.celery.conf
    assert conf.broker_transport_options["confirm_publish"] is True
    assert conf.task_queue_max_priority == 9
    # every queue Celery declares, the ones it creates on first use included
    assert rabbit_app.celery.amqp.queues["sas.agent.svc"].queue_arguments == \
        {"x-max-priority": 9}
    assert rabbit_app.router.broker_priority(9) == 9  # RabbitMQ serves the highest first
    producer = Producer(AMQP)
    assert producer.celery.conf.task_queue_max_priority == 9, "the producer declares sas.scheduler alike"
    assert producer.celery.conf.broker_transport_options == {"confirm_publish": True}
    redis_app = SasApp(Settings(broker_url="redis://127.0.0.1:6379/0", home=tmp_path / "r"))
    assert "confirm_publish" not in redis_app.celery.conf.broker_transport_options
    assert redis_app.router.broker_priority(9) == 0  # Redis serves 0 first


def test_a_step_that_could_outlive_the_consumer_timeout_is_refused_with_both_numbers(rabbit_app):
    too_long = Workflow("slow", [Step("work", "svc.work", timeout=1700)])
    with pytest.raises(WorkflowDefinitionError) as refused:
        rabbit_app.register(too_long)
    assert "step 'work': timeout 1700s plus the clock-skew margin 120s (1820s) is not below the broker's " \
           "consumer timeout (1800s)" in str(refused.value)
    assert "SAS_BROKER_CONSUMER_TIMEOUT" in str(refused.value) and "slow" not in rabbit_app.workflows
    rabbit_app.register(Workflow("fits", [Step("work", "svc.work", timeout=1600)]))
    # a longer step once the broker's consumer_timeout (and the setting) says so; Redis's
    # visibility timeout does not apply to RabbitMQ
    raised = SasApp(Settings(broker_url=AMQP, home=rabbit_app.settings.home, broker_consumer_timeout=7200,
                             visibility_timeout=60))
    raised.agent("svc").action(lambda call: {}, name="work")
    raised.register(Workflow("slow", [Step("work", "svc.work", timeout=3600)]))
    with pytest.raises(ValueError, match="broker_consumer_timeout must be positive"):
        Settings(broker_url=AMQP, broker_consumer_timeout=0)


def test_beat_s_publishes_wait_for_rabbitmq_s_confirm_no_longer_than_the_router_s(tmp_path):
    """A publish waits for the broker's confirm at most CONFIRM_TIMEOUT: beat's sweep, schedule
    ticks and retention too, not for ever on a broker that does not answer."""
    app = SasApp(Settings(broker_url=AMQP, home=tmp_path / "home", retention="30d"))
    app.agent("svc").action(lambda call: {}, name="work")
    app.workflow("nightly", [Step("a", "svc.work")])
    app.schedule("nightly", cron="0 2 * * *")
    entries = app.celery.conf.beat_schedule
    assert {name: entry["options"].get("confirm_timeout") for name, entry in entries.items()} == {
        "sas.supervisor.sweep": CONFIRM_TIMEOUT, "sas.schedules.tick": CONFIRM_TIMEOUT,
        "sas.retention.purge": CONFIRM_TIMEOUT}
    on_redis = SasApp(Settings(broker_url="redis://127.0.0.1:6379/0", home=tmp_path / "r"))
    assert "confirm_timeout" not in on_redis.celery.conf.beat_schedule["sas.supervisor.sweep"]["options"]
    app.store.dispose()
    on_redis.store.dispose()


def test_a_deployment_s_transport_options_are_merged_into_sas_app_s_not_put_in_their_place(tmp_path, caplog,
                                                                                           monkeypatch):
    """A celeryconfig that sets one transport option keeps publisher confirms (with a log line
    saying so); one that turns them off is obeyed, with a warning."""
    (tmp_path / "own_config.py").write_text("broker_transport_options = {'max_retries': 3}\n")
    (tmp_path / "no_confirms.py").write_text("broker_transport_options = {'confirm_publish': False}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with caplog.at_level("INFO", logger="sas_app"):
        app = SasApp(Settings(broker_url=AMQP, home=tmp_path / "home"), celery_config="own_config")
    assert app.celery.conf.broker_transport_options == {"confirm_publish": True, "max_retries": 3}
    assert app.router.confirm == {"confirm_timeout": CONFIRM_TIMEOUT}
    assert "which keeps confirm_publish=True" in caplog.text
    with caplog.at_level("INFO", logger="sas_app"):
        off = SasApp(Settings(broker_url=AMQP, home=tmp_path / "home"), celery_config="no_confirms")
    assert off.celery.conf.broker_transport_options == {"confirm_publish": False}
    assert "turns publisher confirms off" in caplog.text
    redis_app = SasApp(Settings(broker_url="redis://127.0.0.1:6379/0", home=tmp_path / "r", visibility_timeout=7200),
                       celery_config="own_config")
    assert redis_app.celery.conf.broker_transport_options == {"visibility_timeout": 7200, "max_retries": 3}
    for a in (app, off, redis_app):
        a.store.dispose()
