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
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from sas_app.messaging import memory_transport
from sas_app.messaging.celery_config import AMQP
from sas_app.messaging.routing import SCHEDULER_QUEUE, SUBMIT, confirm_options
from sas_app.settings import is_amqp


class Producer:
    def __init__(self, broker_url: str, **celery_settings: Any) -> None:
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
        return str(self.celery.send_task(SUBMIT, kwargs=kwargs, queue=SCHEDULER_QUEUE,
                                         **confirm_options(self.celery)).id)

    def close(self) -> None:
        self.celery.close()
