"""A pool process that died mid-step, reported to the Scheduler by its worker's main process.

Celery's ``reject_on_worker_lost`` puts the message of a pool process that died back on the queue,
where the same attempt runs again at once: a step that kills its worker every time (a poison step)
would then kill workers in a loop until its message expires. Instead the main process reports the
lost attempt (``sas.scheduler.step_lost``), which the Scheduler counts as a failure and retries
after a back-off, as a new attempt, or fails at its threshold; the message is then dropped. Only if
that report cannot be sent does the message go back to the queue (and the Supervisor recovers the
step at its complete-by either way).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from billiard.exceptions import WorkerLostError
from celery.worker.request import Request

from sas_app.messaging.publishes import Publish, headers
from sas_app.messaging.routing import SCHEDULER_QUEUE, STEP_LOST, confirm_options

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)


class AgentRequest(Request):  # type: ignore[misc]
    """How an agent worker's main process handles one step's message: a lost pool process is
    reported to the Scheduler, and its message dropped once the report is sent."""

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> Any:
        exc = getattr(exc_info.exception, "exc", exc_info.exception)  # ExceptionWithTraceback
        lost = isinstance(exc, WorkerLostError) or (
            isinstance(exc, (SystemExit, KeyboardInterrupt))
            and not (self._already_cancelled or self._already_revoked)
        )
        self.lost_reported = lost and self._report_lost(str(exc))
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def reject(self, requeue: bool = False) -> None:
        super().reject(requeue=requeue and not getattr(self, "lost_reported", False))

    def _report_lost(self, reason: str) -> bool:
        return report_lost(self.task.app, self.kwargs if isinstance(self.kwargs, dict) else {}, reason)


def report_lost(celery: Celery, message: dict[str, Any], reason: str) -> bool:
    """Tell the Scheduler that the worker process running the step of ``message`` (an agent
    message's arguments) died (``sas.scheduler.step_lost``). False if the step cannot be named
    or the report cannot be sent: the message then goes back to its queue, as Celery would do."""
    try:
        report = {"run_id": str(message["run_id"]), "position": int(message["position"]),
                  "attempt": int(message["attempt"]), "reason": reason[:200]}
    except (KeyError, TypeError, ValueError):
        return False  # not a step we can name; Celery's default applies
    try:
        celery.send_task(STEP_LOST, kwargs=report, queue=SCHEDULER_QUEUE, headers=headers(Publish.STEP_LOST),
                         **confirm_options(celery))
    except Exception:
        log.exception("could not report the lost worker of %s; the message goes back to the queue", report)
        return False
    log.warning("worker lost while running %s (%s); reported to the Scheduler", report, reason)
    return True

