"""The order example's simulated remote service (:mod:`workers.remote_service`) as a test's stack
starts it: ``python -m harness.service --name payment --port ...``, without the ``sas`` command.
The service needs the standard library only, where ``sas payment-service`` loads Celery and the
whole app before it serves (a second of CPU, twice a stack, on a suite bound by its CPU).

Like every process a harness starts (:func:`sas_app.testing.processes.hold_lifeline`, which
this cannot import without loading the app), it stops once the harness that started it is gone:
a harness killed outright cleans nothing up."""

from __future__ import annotations

import os
import threading
import time

from workers import remote_service

#: what :class:`sas_app.testing.processes.Processes` names the harness's pid by, in the environment
LIFELINE = "SAS_LIFELINE"


def _stop_when_orphaned(harness: int) -> None:
    while os.getppid() == harness:
        time.sleep(0.5)
    os._exit(0)  # a service holds nothing to finish: its ledger commits each request


def _passed_on(harness: int) -> bool:
    """Started by a process the harness started (a wrapper), the harness still running: the
    wrapper's to watch."""
    if os.getppid() == harness:
        return False
    try:
        os.kill(harness, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    harness = os.environ.get(LIFELINE, "")
    if harness.isdigit() and not _passed_on(int(harness)):
        threading.Thread(target=_stop_when_orphaned, args=(int(harness),), daemon=True).start()
    remote_service.main()
