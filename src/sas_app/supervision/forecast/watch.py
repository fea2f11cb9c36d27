"""The Supervisor's at-risk watch (every SAS_AT_RISK_INTERVAL, taken by its workers' lookout:
:mod:`sas_app.supervision.forecast.lookout`): an alert, once per step, for each running step whose
message will likely be taken from its agent's queue past its complete-by
(:mod:`sas_app.supervision.forecast.queue_model` says how that is judged), told as one alert per queue
and incident.

Looks come several times a second: a step at the margin is judged in its last look, a fraction of a
second before its complete-by, when the forecast is seldom wrong — once: a look less than half an
interval after the last one taken, by any process (each Supervisor worker looks), is skipped. A queue
silent while this process could not see it (it has just started, or the broker or the database did not
answer it: they were down for the workers too) is not called stuck before it has seen it a while. While
the broker does not answer, nothing is taken from it: the steps its queues held when it last did are
told in their last look (:func:`sas_app.supervision.forecast.queue_model.stranded`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from math import inf

from sas_app.engine.alerts import AT_RISK, Alert, Alerts, grouped
from sas_app.messaging.routing import WATCH, agent_queue
from sas_app.settings import Settings, instance_id
from sas_app.store import StepRow, Store
from sas_app.supervision.forecast.queue_model import (
    SETTLE_S,
    Risk,
    draining,
    forecast,
    former_pace,
    note_shorter,
    stranded,
)
from sas_app.supervision.queue_depths import QueueDepths, queued_steps

#: A look that comes less than this share of SAS_AT_RISK_INTERVAL after the last one taken (by any
#: process) is skipped. A step at the margin is judged at its pace in its last look, once; two beats
#: sent every look twice (before the lookout took them), and looks that waited behind a slow task
#: arrived together — each more look in a step's last interval one more coin toss
#: (docs/explanation/measurements-behind-the-code.md).
TAKEN_APART = 0.5

#: each look, at DEBUG (SAS_DEBUG_LOGS=sas_app.supervision.forecast.watch): what it read and judged of
#: each queue
log = logging.getLogger(__name__)


class Watch:
    def __init__(self, store: Store, settings: Settings, alerts: Alerts, depths: QueueDepths,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        #: this process's clock, for how long since its last look and its last telling: the app's
        #: injected clock in tests, so that a gap is a step forward
        self.clock = clock
        self.settings = settings
        self.alerts = alerts
        self.depths = depths
        #: per queue, when this process last told of its steps at risk, and those found since, untold
        self._told: dict[str, float] = {}
        self._untold: dict[str, list[Alert]] = {}
        #: since when this process has seen the queues (the store's clock); None while it has not:
        #: it has just started, the broker or the database did not answer it, or no look came to
        #: it for a while (beat could not send them: the broker was down)
        self._seen_since: float | None = None
        #: when this process last looked (monotonic)
        self._looked_at = -inf
        #: per queue, its depth at this process's last look (and when, the store's clock), and the spans
        #: between two of its looks that found it getting shorter, within the at-risk window: its
        #: workers were taking messages then (:func:`sas_app.supervision.forecast.queue_model.draining`)
        self._depth_at: dict[str, tuple[float, int]] = {}
        self._taken: dict[str, deque[tuple[float, float]]] = {}
        #: per agent, the steps whose messages waited in its queue at the last look that read it
        self._waiting: dict[str, list[StepRow]] = {}
        self._lock = threading.Lock()  # the lookout's thread, and any caller of Supervisor.watch

    def look(self) -> list[Alert]:
        """Judge the queues with messages waiting, record the steps at risk and tell them
        (:meth:`_tell`); the recorded alerts are the ones raised."""
        looked = self.clock()
        with self._lock:
            # no look came to this process for a while (its lookout was held up): blind meanwhile
            if looked - self._looked_at > max(SETTLE_S, 10 * self.settings.at_risk_interval):
                self._seen_since = None
            self._looked_at = looked
        blind = True  # until the broker and the database have answered
        by_queue: dict[str, list[Alert]] = {}
        try:
            if self.store.take_look(WATCH, self.settings.at_risk_interval * TAKEN_APART):
                read = self.depths.of_busy_agents()
                unread = [agent for agent, depth in read.of.items() if depth is None]
                depths = {agent: depth for agent, depth in read.of.items() if depth}
                if depths or unread:
                    by_queue = self._judge(depths, unread, read.at)
                else:  # every queue empty: what they held is gone
                    self._waiting = {}
                    log.debug("look: no message waits")
                blind = bool(unread)
            else:  # another look was taken just now: this one would judge the margin a second time
                blind = False
                log.debug("look skipped: another was taken less than %gs ago",
                          self.settings.at_risk_interval * TAKEN_APART)
        finally:
            if blind:
                self._seen_since = None
        self._tell(by_queue)
        return [alert for alerts in by_queue.values() for alert in alerts]

    def _judge(self, depths: dict[str, int], unread: list[str], read_at: float | None) -> dict[str, list[Alert]]:
        """The at-risk alerts recorded for the queues with messages waiting (``depths``: how
        many, read at ``read_at``), by queue, each step's once; ``unread``: the agents whose queue
        could not be read just now (the broker did not answer), judged by what it held when it
        last did."""
        s = self.settings
        by_queue: dict[str, list[Alert]] = {}
        said: list[str] = []  # what this look read and judged of each queue, for the debug log
        with self.store.begin() as tx:
            now = tx.now()
            seen_since = now if self._seen_since is None else self._seen_since
            if not unread:
                self._seen_since = seen_since
            taken = self.note_depths(depths, now)
            waiting = {agent: self._waiting[agent] for agent in unread if agent in self._waiting}
            risks_of: dict[str, list[Risk]] = {}
            for agent, depth in depths.items():
                queue = agent_queue(agent)
                queued, _ = queued_steps(tx, agent, depth, read_at)
                waiting[agent] = queued
                if not queued:
                    said.append(f"{agent} {depth} waiting, no step running")
                    continue
                completed, asked_at = tx.sweep.recent_completions(agent, s.at_risk_window)
                per_second = draining(completed, asked_at, head=queued[0], seen_since=seen_since,
                                      taken=taken.get(queue, ()))
                if per_second is None:  # a backlog too young to judge
                    said.append(f"{agent} {depth} waiting, too young to judge")
                    continue
                risks_of[agent] = forecast(queued, now, per_second, every=s.at_risk_interval,
                                           former=former_pace(completed, asked_at))
                said.append(f"{agent} {depth} waiting, {per_second:.1f}/s, {len(risks_of[agent])} at risk")
            for agent in unread:  # its steps still running wait as they did: nothing is taken meanwhile
                if waiting.get(agent):
                    still = tx.sweep.still_running([(step.id, step.attempt) for step in waiting[agent]])
                    waiting[agent] = [step for step in waiting[agent] if (step.id, step.attempt) in still]
                    risks_of[agent] = stranded(waiting[agent], now, every=s.at_risk_interval)
                said.append(f"{agent} unread, {len(risks_of.get(agent, ()))} at risk")
            self._waiting = waiting
            for agent, risks in risks_of.items():
                queue = agent_queue(agent)
                names = tx.sweep.run_names({risk.step.run_id for risk in risks}) if risks else {}
                warnings = [Alert(step.run_id, *names[step.run_id], step.name, step.position, step.attempt,
                                  f"{risk.reason} on {queue}", AT_RISK)
                            for risk in risks if (step := risk.step).run_id in names]
                told = tx.sweep.alerts_raised([w.dedup_key for w in warnings]) if warnings else set()
                for warning in warnings:  # each step once: those told in an earlier look are not written again
                    alert = None if warning.dedup_key in told else self.alerts.record(tx, warning, instance_id())
                    if alert is not None:
                        by_queue.setdefault(queue, []).append(alert)
        log.debug("look at %.3f (queues read at %.3f): %s", now, read_at or now, "; ".join(said))
        return by_queue

    def note_depths(self, depths: dict[str, int], now: float) -> dict[str, list[tuple[float, float]]]:
        """Note the depths read just now (``depths``, of the queues with messages waiting; the
        others were empty or unread) and return, per queue, the spans from one of this process's
        looks to the next that found it shorter, within the at-risk window
        (:func:`~sas_app.supervision.forecast.queue_model.note_shorter`): the looks come a tenth of
        a second apart, shared
        by a worker's pool processes, and behind its other tasks (after a broker's outage they
        can come half a second or more apart)."""
        with self._lock:
            for agent, depth in depths.items():
                queue = agent_queue(agent)
                note_shorter(self._taken.setdefault(queue, deque()), self._depth_at.get(queue), depth, now,
                             self.settings.at_risk_window)
                self._depth_at[queue] = (now, depth)
            looked_at = {agent_queue(agent) for agent in depths}
            for queue in list(self._depth_at):
                if queue not in looked_at:  # empty, or unread: the next depth read has nothing to go by
                    del self._depth_at[queue]
                    self._taken.pop(queue, None)
            return {queue: list(taken) for queue, taken in self._taken.items()}

    def _tell(self, found: dict[str, list[Alert]]) -> None:
        """Tell the steps ``found`` at risk as one alert per queue and incident: a queue's first at
        once; those found in the looks after it (a backlog grows for seconds, looked at several
        times a second) together, at most once a sweep interval, with their count — what this
        process found and has not told yet, in the order found (each look's nearest its queue's
        head first). A process that dies first leaves those recorded (the run's page, the
        ``alerts`` table), untold."""
        now = self.clock()
        due: dict[str, list[Alert]] = {}
        with self._lock:
            for queue, alerts in found.items():
                self._untold.setdefault(queue, []).extend(alerts)
            for queue in list(self._untold):
                if now - self._told.get(queue, -inf) >= self.settings.supervisor_interval:
                    due[queue] = self._untold.pop(queue)
                    self._told[queue] = now
        for queue, group in due.items():
            self.alerts.emit(grouped(group, f"waiting on {queue} are likely to miss their complete-by"))
