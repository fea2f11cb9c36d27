"""Alerts: one path, several sinks.

An alert is stored in the ``alerts`` table and as an event in the same transaction as the
transition that raised it, once per deduplication key (a failure once per step attempt, an
at-risk warning once per step), so retries, duplicate messages and concurrent Supervisors never
raise it twice. After the commit it goes to the log, to the callable named by SAS_ALERT_HOOK, and
to the webhook at SAS_ALERT_WEBHOOK, told per incident: the steps of one agent's queue that a sweep
finds at risk, and the steps a sweep's batch fails at once at the same step of one workflow, as one
alert — the first one's, with their ``count`` and the first 20 of their ``runs`` (each is stored
with its own run and key).
The webhook is posted from a background thread of the raising process, with a timeout and retries
with back-off, so a slow or dead webhook never delays a sweep or a Scheduler; the ``alerts``
table stays the durable record if the process dies first. A hook that raises is logged and
ignored.
"""

from __future__ import annotations

import importlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from sas_app.settings import redact_url
from sas_app.store import Tx

log = logging.getLogger(__name__)

AlertHook = Callable[["Alert"], Any]

#: what an alert reports
FAILED, COMPENSATION_FAILED, COMPENSATION_STUCK, AT_RISK, DEADLINE, ESCALATED = (
    "failed", "compensation_failed", "compensation_stuck", "at_risk", "deadline", "escalated")


@dataclass(frozen=True)
class Alert:
    run_id: str
    workflow: str
    business_key: str
    step: str | None
    position: int | None
    attempt: int | None
    reason: str
    kind: str = FAILED
    #: how many alerts of one cause this one stands for (the steps of one queue found at risk in one
    #: sweep: one alert, not one per step), and the first runs among them
    count: int = 1
    runs: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["runs"] = list(self.runs)
        return out

    @property
    def dedup_key(self) -> str:
        """Failures: one alert per step attempt. At risk: one per step of a run."""
        if self.kind == AT_RISK:
            return at_risk_key(self.run_id, self.position)
        return f"{self.kind}:{self.run_id}:{self.position}:{self.attempt}"


def at_risk_key(run_id: str, position: int | None) -> str:
    """The key of a step's at-risk alert (one a step, whatever its attempt)."""
    return f"{AT_RISK}:{run_id}:{position}"


#: the most runs a grouped alert lists
MAX_LISTED = 20


def grouped(alerts: list[Alert], cause: str, of: str = "steps") -> Alert:
    """One alert for ``alerts`` of one ``cause``: the first (the most urgent), counting them all."""
    first = alerts[0]
    if len(alerts) == 1:
        return first
    return replace(first, count=len(alerts), runs=tuple(a.run_id for a in alerts[:MAX_LISTED]),
                   reason=f"{len(alerts)} {of} {cause}; the first: {first.reason}")


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


class WebhookSender:
    """Posts alerts to a URL from one daemon thread per process, each with a timeout and up to
    ``tries`` tries with exponential back-off. A full backlog drops the newest, with a log line."""

    def __init__(self, url: str, timeout: float, tries: int = 4, backlog: int = 1000) -> None:
        self.url = url
        self.timeout = timeout
        self.tries = tries
        self.backlog = backlog
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(backlog)
        self._pid = 0
        self._lock = threading.Lock()

    def send(self, alert: dict[str, Any]) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use in this (possibly forked) process
                self._queue = queue.Queue(self.backlog)
                threading.Thread(target=self._run, name="sas-alert-webhook", daemon=True).start()
                self._pid = os.getpid()
        try:
            self._queue.put_nowait(alert)
        except queue.Full:
            log.error("alert webhook backlog full; dropped the alert for run %s", alert.get("run_id"))

    def _run(self) -> None:
        import httpx  # here, in the thread that posts: the processes without a webhook never load it

        backlog = self._queue
        while True:
            alert = backlog.get()
            try:
                for attempt in Retrying(retry=retry_if_exception_type(httpx.HTTPError),
                                        wait=wait_exponential(multiplier=0.5, max=8),
                                        stop=stop_after_attempt(self.tries), reraise=True):
                    with attempt:
                        httpx.post(self.url, json=alert, timeout=self.timeout).raise_for_status()
            except Exception:
                log.exception("alert webhook %s failed %d times for run %s", redact_url(self.url), self.tries,
                              alert.get("run_id"))


class Alerts:
    """Record alerts inside the raising transaction; emit them to the sinks after the commit."""

    def __init__(self, hook: AlertHook | None = None, webhook: str = "", webhook_timeout: float = 2.0) -> None:
        self.hook = hook
        self.webhook = WebhookSender(webhook, webhook_timeout) if webhook else None

    def record(self, tx: Tx, alert: Alert, actor: str) -> Alert | None:
        """Store ``alert`` in the caller's transaction; None if this alert was raised before."""
        detail = {k: v for k, v in alert.as_dict().items() if k not in ("count", "runs")}  # one step's own
        stored = tx.record_alert(alert.dedup_key, alert.run_id, alert.position, alert.kind, alert.attempt,
                                 alert.reason, actor, detail)
        return alert if stored else None

    def emit_grouped(self, raised: list[Alert | None]) -> None:
        """Tell ``raised`` (a sweep's batch) with one alert per kind and step of a workflow: steps
        failing together for one cause (their agent down, say) are one incident, with a count."""
        groups: dict[tuple[str, str, str | None], list[Alert]] = {}
        for alert in raised:
            if alert is not None:
                groups.setdefault((alert.kind, alert.workflow, alert.step), []).append(alert)
        for (kind, workflow, step), group in groups.items():
            at = f"at step {step!r}" if step is not None else "(the run itself)"
            self.emit(grouped(group, f"of {workflow} {at} raised {kind!r} at once",
                              "steps" if step is not None else "runs"))

    def emit(self, alert: Alert | None) -> None:
        if alert is None:
            return
        level = logging.WARNING if alert.kind == AT_RISK else logging.ERROR
        log.log(level, "ALERT %s run %s (%s %s) step %s attempt %s: %s", alert.kind, alert.run_id,
                alert.workflow, alert.business_key, alert.step, alert.attempt, alert.reason)
        if self.hook is not None:
            try:
                self.hook(alert)
            except Exception:  # a broken hook must never stop the Scheduler or the Supervisor
                log.exception("alert hook failed for run %s", alert.run_id)
        if self.webhook is not None:
            self.webhook.send(alert.as_dict())
