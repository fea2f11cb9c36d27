"""The Celery settings sas_app's reliability rests on, derived from :class:`sas_app.settings.Settings`
(so every one of them can be set from the environment: SAS_BROKER_URL, SAS_VISIBILITY_TIMEOUT, …).

``SasApp`` applies :func:`celery_settings` to the Celery app it builds, so two apps with
different settings can live in one process (tests do this). A deployment's own Celery settings
(the repository's ``celeryconfig.py``, or any module named by ``SasApp(celery_config=...)``) are
applied on top (:func:`with_own`): a setting they name wins, but ``broker_transport_options`` is
merged key by key, so that setting one transport option does not silently drop sas_app's others
(publisher confirms on RabbitMQ, the visibility timeout on Redis).
"""

from __future__ import annotations

import logging
import ssl
from datetime import timedelta
from typing import Any

from sas_app.messaging import filesystem_transport, memory_transport, reconnect, redis_transport
from sas_app.messaging.routing import SCHEDULER_QUEUE, SUPERVISOR_QUEUE, SWEEP
from sas_app.settings import Settings

log = logging.getLogger(__name__)

#: On RabbitMQ: a publish returns once the broker has taken the message (publisher confirms), so
#: one lost in a broker restart is an error here rather than silence; every queue Celery declares
#: (sas.scheduler, sas.agent.*, created on first use) takes priorities 0-9, so an urgent run's
#: steps overtake the others' (see Router.broker_priority). Whoever else declares those queues — a
#: producer — must declare them alike: RabbitMQ refuses a queue redeclared with other arguments.
AMQP: dict[str, Any] = {"broker_transport_options": {"confirm_publish": True}, "task_queue_max_priority": 9}


def celery_settings(settings: Settings) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "broker_url": settings.broker_url,
        # JSON only: a pickle body on any queue is refused, never executed.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "event_serializer": "json",
        # Outcomes live in the state store; Celery's result backend would be a second truth.
        "task_ignore_result": True,
        "result_backend": None,
        # One message reserved at a time: a worker that dies strands at most one step, and a
        # long step does not hold others hostage in its prefetch buffer.
        "worker_prefetch_multiplier": 1,
        # A pool process that died is declared lost after this long (Celery waits 10 s by default
        # for a result it might still have sent; ours go to the state store, never that pipe), so
        # its step is reported to the Scheduler at once (see sas_app.agents.worker_lost).
        "worker_lost_wait": 1.0,
        "task_acks_on_failure_or_timeout": True,
        "task_default_queue": SCHEDULER_QUEUE,
        "task_create_missing_queues": True,
        "broker_connection_retry_on_startup": True,
        # a broker that comes back is used again within a second, not Celery's back-off of up to 30 s
        "worker_consumer": reconnect.NAME,
        # A message is redelivered only if unacknowledged for longer than any step may take.
        "broker_transport_options": {"visibility_timeout": settings.visibility_timeout},
        # Publishing is a hint (the Supervisor recovers a lost one): never block a worker long on it.
        "task_publish_retry_policy": {
            "max_retries": 3,
            "interval_start": 0.1,
            "interval_step": 0.5,
            "interval_max": 1.0,
        },
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        "enable_utc": True,
        "timezone": "UTC",
        "beat_schedule": {
            SWEEP: {
                "task": SWEEP,
                "schedule": timedelta(seconds=settings.supervisor_interval),
                # A sweep nobody ran in time is dropped: the next one does the same work.
                "options": {"queue": SUPERVISOR_QUEUE, "expires": max(settings.supervisor_interval, 1.0)},
            },
        },
    }
    if settings.amqp_broker:
        conf.update(AMQP)
    tls = broker_tls(settings)
    if tls:
        conf["broker_use_ssl"] = tls
    if settings.broker_url.startswith(("redis://", "rediss://")):
        conf["broker_transport"] = redis_transport.NAME  # one client per channel
    conf.update(memory_transport.options_for(settings.broker_url))  # queues of its own per virtual host
    if settings.embedded_broker:
        # kombu's filesystem transport: every process sharing SAS_HOME shares the queues. A
        # consumer takes a message by renaming its file into ``processed`` (atomic on one file
        # system, so two workers never both take it); it polls every 50 ms when idle. Messages
        # are written whole before they get their name (see sas_app.messaging.filesystem_transport).
        conf["broker_transport"] = filesystem_transport.NAME
        folder = settings.home / "broker"
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        conf["broker_transport_options"] = {
            **conf["broker_transport_options"],
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),  # kombu's default is ./control
            "store_processed": True,
            "polling_interval": 0.05,
        }
    return conf


def broker_tls(settings: Settings) -> dict[str, Any]:
    """Celery's ``broker_use_ssl`` for a broker over TLS: its certificate always verified (against
    SAS_BROKER_CA_FILE, else the system's authorities), a client certificate when given; nothing
    for a broker without TLS."""
    url = settings.broker_url
    if url.startswith("rediss://"):
        return {**settings.redis_tls(url), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    if url.startswith("amqps://"):
        options = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": settings.broker_ca_file or None,
                   "certfile": settings.broker_cert_file or None, "keyfile": settings.broker_key_file or None}
        # None: kombu names each connection's own host (a failover URL's too), and py-amqp checks it
        return {**{k: v for k, v in options.items() if v is not None}, "server_hostname": None}
    return {}


def with_own(conf: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """``conf`` (sas_app's) with a deployment's own settings on top; their
    ``broker_transport_options`` merged into sas_app's, with a log line naming what was kept and a
    warning when they turn publisher confirms off."""
    merged = {**conf, **own}
    ours, theirs = conf.get("broker_transport_options") or {}, own.get("broker_transport_options")
    if isinstance(theirs, dict):
        kept = sorted(set(ours) - set(theirs))
        merged["broker_transport_options"] = {**ours, **theirs}
        if kept:
            log.info("broker_transport_options: your Celery config's are merged into sas_app's, which keeps %s",
                     ", ".join(f"{key}={ours[key]!r}" for key in kept))
        if ours.get("confirm_publish") and not theirs.get("confirm_publish", True):
            log.warning("broker_transport_options: your Celery config turns publisher confirms off: a message "
                        "the broker drops is then not known to be lost until the Supervisor finds its step")
    return merged
