"""Alerts: raised when a run goes to ``error``; stored as an event in the same transaction as the
transition (so exactly one per failure), then logged and handed to the configured hook."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .store import Tx

log = logging.getLogger("sas.alerts")

AlertHook = Callable[["Alert"], Any]


@dataclass(frozen=True)
class Alert:
    run_id: str
    workflow: str
    business_key: str
    step: str | None
    position: int | None
    attempt: int | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_hook(spec: str) -> AlertHook | None:
    """Resolve ``module:function`` (SAS_ALERT_HOOK); empty means no hook."""
    if not spec:
        return None
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"SAS_ALERT_HOOK={spec!r} must look like 'package.module:function'")
    hook = getattr(importlib.import_module(module_name), attr, None)
    if not callable(hook):
        raise ValueError(f"SAS_ALERT_HOOK={spec!r}: {attr!r} is not a callable in {module_name!r}")
    return hook  # type: ignore[no-any-return]


class Alerts:
    """The one alert path: :meth:`record` inside the failing transition, :meth:`emit` after commit."""

    def __init__(self, hook: AlertHook | None = None) -> None:
        self.hook = hook

    def record(self, tx: Tx, alert: Alert, actor: str) -> Alert:
        tx.event(
            alert.run_id, alert.position, "alert", None, None,
            attempt=alert.attempt, actor=actor, detail=alert.as_dict(),
        )
        return alert

    def emit(self, alert: Alert) -> None:
        log.error(
            "ALERT run %s (%s %s) step %s attempt %s: %s",
            alert.run_id, alert.workflow, alert.business_key, alert.step, alert.attempt, alert.reason,
        )
        if self.hook is None:
            return
        try:
            self.hook(alert)
        except Exception:  # a broken hook must never stop the Scheduler or the Supervisor
            log.exception("alert hook failed for run %s", alert.run_id)
