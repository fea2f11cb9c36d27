"""A virtual clock for tests: it stands still until the test (or the environment skipping time)
moves it, so a three-day sleep is one step forward, never a wait."""

from __future__ import annotations

import time
from datetime import timedelta

from sas_app.definitions.steps import seconds_of


class VirtualClock:
    """Epoch seconds that move only forward, and only when asked. Injected as the embedded state
    store's clock (``SasApp(clock=...)``), it is the time every complete-by, back-off, sleep,
    wait, deadline, escalation and cron tick is compared with; an agent measures a step's time
    left on it, and its in-process retries wait on it (:meth:`sleep`)."""

    #: how far past a moment :meth:`move_past` moves
    PAST = 0.001

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else float(start)

    def __call__(self) -> float:
        return self._now

    @property
    def now(self) -> float:
        return self._now

    def advance(self, duration: float | timedelta) -> None:
        """Move forward by ``duration``; a negative one is refused (time never goes back)."""
        step = float(seconds_of(duration))
        if step < 0:
            raise ValueError(f"the clock moves forward only: cannot advance by {duration!r}")
        self._now += step

    def move_to(self, moment: float) -> None:
        """Move forward to ``moment`` (epoch seconds); an earlier one is refused."""
        if moment < self._now:
            raise ValueError(f"the clock moves forward only: {moment} is {self._now - moment:.3f} s before now")
        self._now = float(moment)

    def move_past(self, moment: float) -> None:
        """Move just past ``moment`` (epoch seconds) unless the clock already is: the store acts on
        what is strictly past due."""
        self._now = max(self._now, moment + self.PAST)

    def sleep(self, duration: float) -> None:
        """What an agent's in-process retry waits: the clock moves on, no time passes."""
        self._now += max(float(duration), 0.0)
