"""The at-risk forecast: from what waits in the agents' queues and the pace at which each drains,
which running steps will likely be taken past their complete-by (an ``at_risk`` alert before it
happens), and when a retry sent now would be taken (the pacing of retries).

The Supervisor knows it only through :class:`Forecast`; SAS_AT_RISK_FORECAST=false turns it off:
no look, no at-risk alert, and every expired step retried after its back-off alone. Inside:
the queue's model (``queue_model``), the looks that raise the alerts (``watch``), the thread that
takes them (``lookout``) and the pacing of retries (``pacing``). Why it works as it does, with the
replays behind each constant: docs/explanation/at-risk-forecast.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sas_app.engine.alerts import Alert, Alerts
from sas_app.settings import Settings
from sas_app.store import StepRow, Store, Tx
from sas_app.supervision.forecast.lookout import Lookout
from sas_app.supervision.forecast.pacing import paced_retries
from sas_app.supervision.forecast.watch import Watch
from sas_app.supervision.queue_depths import QueueDepths

__all__ = ["Forecast"]


class Forecast:
    """What the Supervisor asks of the forecast: to look at the queues now and then (:meth:`start`,
    :meth:`look`), and how long each retry of a step that expired in a backlog waits (:meth:`paced`)."""

    def __init__(self, store: Store, settings: Settings, alerts: Alerts, depths: QueueDepths,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.watch = Watch(store, settings, alerts, depths, clock)
        #: the looks, taken by a thread of each worker that consumes the Supervisor's queue
        self.lookout = Lookout(self.look, settings.at_risk_interval)

    @property
    def on(self) -> bool:
        """SAS_AT_RISK_FORECAST: whether the forecast looks and paces at all."""
        return self.settings.at_risk_forecast

    def start(self) -> None:
        """Look every SAS_AT_RISK_INTERVAL from now on (a worker of the Supervisor's queue is ready)."""
        if self.on:
            self.lookout.start()

    def stop(self) -> None:
        self.lookout.stop()

    def look(self) -> list[Alert]:
        """One look at the busy agents' queues: the at-risk alerts it raised."""
        return self.watch.look() if self.on else []

    def paced(self, tx: Tx, expired: list[StepRow], depths: dict[str, int]) -> dict[int, float]:
        """How long the retry of each of ``expired`` that expired in a backlog waits, by step id
        (:mod:`~sas_app.supervision.forecast.pacing`); none while the forecast or SAS_PACE_RETRIES
        is off."""
        if not (self.on and self.settings.pace_retries):
            return {}
        return paced_retries(tx, expired, depths, self.settings.at_risk_window)
