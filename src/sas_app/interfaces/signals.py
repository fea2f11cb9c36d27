"""Signals: what ends a run's wait for an event (:func:`sas_app.definitions.steps.WaitFor`) — an
approval, a payment provider's webhook, a warehouse's confirmation.

:meth:`Signals.send` (``sas.signal(...)`` in Python, ``sas signal`` on the command line, the
dashboard's Approve and Reject buttons) and the Celery task ``sas.signal`` (for producers that
have only the broker: ``app.send_task("sas.signal", kwargs={...})``) check the signal and hand it
to the Scheduler, which records it and ends the wait in one transaction. Every signal is recorded
in the run's history; the first one for a wait is its result, a second is recorded and ignored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sas_app.definitions.workflow import is_name
from sas_app.engine.scheduler import Scheduler
from sas_app.errors import InvalidSignal, SasError, UnknownRun
from sas_app.messaging.routing import SIGNAL, confirm_options
from sas_app.messaging.signing import BadSignature, Gate
from sas_app.settings import Settings
from sas_app.store import Store, stored_object

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SignalReceipt:
    """What became of a signal: ``consumed`` (it ended the wait), ``kept`` (the run has not
    reached the wait yet: it will end it when it does) or ``ignored`` (that wait already had its
    signal, or has ended: recorded in the run's history, nothing else)."""

    run_id: str
    event: str
    status: str


class Signals:
    def __init__(self, store: Store, settings: Settings, scheduler: Scheduler, celery: Celery,
                 gate: Gate | None = None) -> None:
        self.store = store
        self.settings = settings
        self.scheduler = scheduler
        #: who may signal through the broker (SAS_BROKER_TRUST)
        self.gate = gate or Gate("open", "", settings.broker_signature_max_age)

        @celery.task(name=SIGNAL, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True,
                     ignore_result=True, max_retries=None)
        def signal(task: Any, event: str = "", payload: Any = None, run_id: str | None = None,
                   workflow: str | None = None, business_key: str | None = None, by: str = "",
                   sas_signature: Any = None) -> dict[str, str]:
            sent = dict(task.request.kwargs or {})  # as sent: what the signature covers
            run: Any = run_id if run_id is not None else (workflow, business_key)
            try:
                verified = self.gate.admit(SIGNAL, sent, task.request.args or ())
            except BadSignature as exc:
                log.error("signal %r from the broker refused: %s", event, exc)
                return {"refused": str(exc)}
            try:
                receipt = self.send(run, event, payload, by=str(by or verified or "broker"))
            except SasError as exc:  # nobody to answer: the refusal is logged, nothing is written
                log.error("signal %r refused: %s", event, exc)
                return {"refused": str(exc)}
            except Exception as exc:  # the store is down (a failover, a deadlock): the signal must not be lost
                wait = min(2.0 ** task.request.retries, 30.0)
                log.warning("signal %r not recorded (%s); trying again in %.0f s", event, exc, wait)
                raise task.retry(exc=exc, countdown=wait, kwargs=self.gate.resigned(SIGNAL, sent, verified),
                                 **confirm_options(task.app)) from None
            return {"run_id": receipt.run_id, "status": receipt.status}

    def send(self, run: str | tuple[str, str], event: str, payload: Any = None, *, by: str = "") -> SignalReceipt:
        """Send ``event`` (with ``payload``, a JSON object) to ``run`` — a run id, or a
        ``(workflow, business_key)`` pair. Raises :class:`UnknownRun` or :class:`InvalidSignal`
        naming the problem, having written nothing."""
        if not is_name(event):
            raise InvalidSignal(f"event must be a name (letters, digits, '_', '-'), got {event!r}")
        try:
            payload = stored_object({} if payload is None else payload, self.settings.max_payload_bytes,
                                    "a signal's payload")
        except ValueError as exc:
            raise InvalidSignal(str(exc)) from None
        if not isinstance(by, str) or len(by) > 200:
            raise InvalidSignal(f"by must be a name of at most 200 characters, got {by!r}")
        run_id = self.run_id(run)
        return SignalReceipt(run_id, event, self.scheduler.signal(run_id, event, payload, by))

    def run_id(self, run: Any) -> str:
        """The id of ``run`` — a run id, or a ``(workflow, business_key)`` pair: :class:`UnknownRun`
        where no run has that key, :class:`InvalidSignal` for anything else."""
        if isinstance(run, str) and run:
            return run
        if isinstance(run, (tuple, list)) and len(run) == 2 and all(isinstance(p, str) and p for p in run):
            found = self.store.find_run(run[0], run[1])
            if found is None:
                raise UnknownRun(f"no run of workflow {run[0]!r} with business key {run[1]!r}")
            return found.id
        raise InvalidSignal(f"name the run by its id or by (workflow, business_key), got {run!r}")
