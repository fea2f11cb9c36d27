"""Submitting with only the broker: :class:`Producer` sends the Celery task ``sas.submit`` to the
Scheduler's queue, where a Scheduler worker checks it with the same rules as
:meth:`SasApp.submit <sas_app.SasApp.submit>` and writes the run. It needs no database and imports
no workflow code — what a Django or FastAPI service that enqueues Celery work already has.

>>> producer = Producer("redis://broker:6379/0")
>>> producer.submit("order", {"amount": 12.5}, business_key="order-42", reply_to="order-events")

Any Celery app can do the same without sas_app installed::

    app.send_task("sas.submit", kwargs={"workflow": "order", "payload": {"amount": 12.5},
                                        "business_key": "order-42"}, queue="sas.scheduler")

A refused submission (an unknown workflow, a bad payload, a business key already used with
another payload) is logged by the Scheduler and answered on ``reply_to``, when given, with
``{"kind": "refused", "reason": ...}``; nothing is written. The same business key sent twice makes
one run.

Where the deployment takes only signed work from the broker (``SAS_BROKER_TRUST=signed``), give
the producer a key of ``SAS_BROKER_KEYS`` (``signing_key="billing:<secret>"``): each message then
carries its HMAC (:mod:`sas_app.messaging.signing`).
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery

from sas_app.messaging import memory_transport
from sas_app.messaging.celery_config import AMQP
from sas_app.messaging.routing import SCHEDULER_QUEUE, SIGNAL, SUBMIT, confirm_options
from sas_app.messaging.signing import SIGNATURE, parse_keys, sign
from sas_app.settings import is_amqp


class Producer:
    def __init__(self, broker_url: str, *, signing_key: str = "", **celery_settings: Any) -> None:
        """``signing_key``: ``<id>:<secret>``, one of the deployment's SAS_BROKER_KEYS, to sign each message."""
        keys = parse_keys(signing_key)
        if len(keys) > 1:
            raise ValueError("signing_key is one <id>:<secret>, not a list")
        self.key = next(iter(keys.items()), None)
        self.celery = Celery("sas-producer", broker=broker_url, set_as_current=False)
        amqp = AMQP if is_amqp(broker_url) else {}
        # the in-memory broker's queues per virtual host, as the app's (a test environment's, say)
        self.celery.conf.update({"task_serializer": "json", "accept_content": ["json"],
                                 "broker_connection_retry_on_startup": True, **amqp,
                                 **memory_transport.options_for(broker_url), **celery_settings})

    def submit(self, workflow: str, payload: dict[str, Any], *, business_key: str, reply_to: str | None = None,
               priority: int = 5) -> str:
        """Send the submission; returns the Celery task id of the message (not a run id: the run
        is written by the Scheduler worker that takes it)."""
        kwargs: dict[str, Any] = {"workflow": workflow, "payload": payload, "business_key": business_key,
                                  "priority": priority}
        if reply_to is not None:
            kwargs["reply_to"] = reply_to
        return self._send(SUBMIT, kwargs)

    def signal(self, event: str, payload: dict[str, Any] | None = None, *, run_id: str | None = None,
               workflow: str | None = None, business_key: str | None = None, by: str = "") -> str:
        """Send ``event`` to a run waiting for it, named by its id or by its workflow and business
        key; returns the message's Celery task id. A refusal is logged by the Scheduler."""
        if (run_id is None) == (workflow is None or business_key is None):
            raise ValueError("name the run by run_id=, or by workflow= and business_key=")
        kwargs: dict[str, Any] = {"event": event, "payload": payload or {}}
        if run_id is not None:
            kwargs["run_id"] = run_id
        else:
            kwargs.update(workflow=workflow, business_key=business_key)
        if by:
            kwargs["by"] = by
        return self._send(SIGNAL, kwargs)

    def _send(self, task: str, kwargs: dict[str, Any]) -> str:
        if self.key is not None:
            kwargs[SIGNATURE] = sign(task, kwargs, *self.key, time.time())
        return str(self.celery.send_task(task, kwargs=kwargs, queue=SCHEDULER_QUEUE,
                                         **confirm_options(self.celery)).id)

    def close(self) -> None:
        self.celery.close()
