"""Prometheus metrics, read from the state store (served by ``sas dashboard`` at ``/metrics``).

The store is the truth, so the metrics come from it rather than from counters kept in each worker
process: gauges are read at each scrape (runs by state, Supervisors' heartbeats, breakers), and the
counters and histograms follow the append-only ``events`` table by its primary key, each scrape
reading only the events written since the last one. Every process on every host is counted, with
no multiprocess directory and no push gateway; they start from the history in the store when the
dashboard starts, and ``rate()`` reads them as usual. What they have counted is saved in the store
at most every ``CHECKPOINT_EVERY`` seconds (:mod:`sas_app.store.checkpoints`): a dashboard started
later resumes from the furthest checkpoint any replica saved instead of reading the whole history
again, and its counters keep what a purge has deleted since.

Series: ``sas_runs{workflow,state}`` (runs not finished, or in error and not rerun),
``sas_runs_finished_total{workflow,state}``,
``sas_step_duration_seconds{agent}`` (dispatch to completion), ``sas_recoveries_total{agent,cause}``
(``expired``: the Supervisor found it past complete-by; ``worker_lost``; ``deferred``: its breaker
was open or its rate limit full; ``silent``: past complete-by, never taken by a worker),
``sas_step_failures_total{agent}``,
``sas_compensations_total{workflow}``, ``sas_alerts_total{kind}``, ``sas_alerts_current{kind}`` (alerts
whose run is in error and not rerun, or unfinished), ``sas_runs_waiting{kind}`` (runs waiting in the store:
``sleep``, ``event``, ``slot``), ``sas_stale_replies_total``,
``sas_supervisor_sweeps_total{instance}``, ``sas_supervisor_last_sweep_age_seconds{instance}``,
``sas_breaker_state{agent}`` (0 closed, 1 half-open, 2 open),
``sas_agent_backlog{agent,state}`` (each agent's steps ``due``, ``dispatched`` and ``retrying``:
:mod:`sas_app.store.backlog`), ``sas_agent_outstanding{agent}`` (due + dispatched: what an agent's
workers scale on), ``sas_agent_oldest_dispatched_seconds{agent}``,
``sas_metrics_caught_up`` (0 while a dashboard started over a long history is still reading it,
``MAX_BATCHES`` x ``BATCH`` events a scrape: the counters are left out until then, so that
``rate()`` never sees the history arrive as a burst), ``sas_doctor_problems{check}`` (what ``sas
doctor`` counts, its checks made in the background, started by a scrape at most every
``DOCTOR_EVERY`` seconds, attempts ended twice over the last ``DOCTOR_SINCE`` seconds; a scrape
answers with the last examination's findings; one check it could not make is left out) and
``sas_doctor_ok`` (1 when every check holds; both absent while no examination has answered).

Every gauge reads what is live — open runs, live steps, the waiting ones — through a partial or
leading-column index, so a scrape costs what is in flight, not the history the store keeps:
finished runs are counted by ``sas_runs_finished_total``, not by ``sas_runs``.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy.exc import SQLAlchemyError

from sas_app.interfaces.doctor import Check
from sas_app.states import TERMINAL_RUN_STATES, Cause, EventKind, RunState, StepState
from sas_app.store.backlog import BACKLOG_STATES, backlog
from sas_app.store.observe import HistoryEvent, Observer

if TYPE_CHECKING:
    from sas_app.app import SasApp

log = logging.getLogger(__name__)

#: step duration buckets, seconds
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: events younger than this (by the database's clock) wait for the next scrape: a transaction
#: that took its id earlier may still be committing
MARGIN = 5.0
BATCH = 20_000
MAX_BATCHES = 10
BREAKER_STATES = {"closed": 0, "half-open": 1, "open": 2}
CAUSES = frozenset(c.value for c in Cause)
#: seconds between two examinations of ``sas doctor``'s checks (they read every live run and ask
#: the workers, for up to a second)
DOCTOR_EVERY = 30.0
#: seconds of history the scrape's examinations read for attempts ended twice (``sas doctor``
#: reads a day): what each reads follows the events of this window
DOCTOR_SINCE = 3600.0
#: seconds a scrape waits for an examination while none has answered (the first, or after one failed)
FIRST_EXAMINATION_WAIT = 5.0
#: the form of what the counters' checkpoint holds (raised when what is counted changes), and the
#: name it is saved under, which says that form and the buckets: a dashboard that counts otherwise
#: (another version, during a rolling upgrade) keeps a checkpoint of its own
CHECKPOINT_FORM = 1
CHECKPOINT = f"metrics-counters-{CHECKPOINT_FORM}-{zlib.crc32(repr(BUCKETS).encode()):08x}"
#: seconds between two saves of the counters' checkpoint by one dashboard
CHECKPOINT_EVERY = 60.0


class StoreCollector(Collector):
    def __init__(self, sas: SasApp, margin: float = MARGIN, batch: int = BATCH, max_batches: int = MAX_BATCHES,
                 doctor_every: float = DOCTOR_EVERY, checkpoint_every: float = CHECKPOINT_EVERY) -> None:
        self.sas = sas
        self.doctor_every = doctor_every
        self.checkpoint_every = checkpoint_every
        self.restored = False
        self.saved_caught_up = False
        self.saved_id = 0
        self.saved_at = float("-inf")
        self.margin = margin
        self.batch = batch
        self.max_batches = max_batches
        self.observer = Observer(sas.store)
        self.lock = threading.Lock()
        self.last_id = 0
        self.finished: Counter[tuple[str, str]] = Counter()
        self.recoveries: Counter[tuple[str, str]] = Counter()
        self.failures: Counter[tuple[str]] = Counter()
        self.compensations: Counter[tuple[str]] = Counter()
        self.alerts: Counter[tuple[str]] = Counter()
        self.stale = 0
        self.durations: dict[str, list[int]] = {}
        self.duration_sums: dict[str, float] = {}
        self.examined: list[Check] | None = None
        self.examining: threading.Thread | None = None
        self.examination_began = 0.0
        self.doctor_lock = threading.Lock()

    def follow(self) -> bool:
        """Count the events written since the last scrape, in id order, up to the first one younger
        than the margin; at most ``max_batches`` batches, so that a dashboard started over a long
        history answers each scrape promptly while it catches up. True once caught up.

        Counting stops at the first young event rather than skipping it: one with a higher id and an
        older time can exist (two transactions inserting at once), and skipping past the young one
        would leave it uncounted for good."""
        before = self.observer.now() - self.margin
        for _ in range(self.max_batches):
            batch = self.observer.history_after(self.last_id, self.batch)
            for event in batch:
                if event.at >= before:
                    return True
                self._count(event)
                self.last_id = event.id
            if len(batch) < self.batch:
                return True
        return False

    def _restore(self) -> None:
        """Resume from the furthest checkpoint saved by a dashboard that counts as this one does
        (its name says how); one that cannot be read is left, and the history read again."""
        saved = self.sas.store.checkpoint(CHECKPOINT)
        self.restored = True
        if saved is None:
            return
        last_id, state = saved
        try:
            counted = [_counts(state[name]) for name in ("finished", "recoveries", "failures", "compensations",
                                                          "alerts")]
            stale = int(state["stale"])
            durations = {str(agent): [int(n) for n in buckets] for agent, buckets in state["durations"].items()}
            duration_sums = {str(agent): float(total) for agent, total in state["duration_sums"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("the counters' checkpoint cannot be read (%s): reading the history again", exc)
            return
        self.finished, self.recoveries, self.failures, self.compensations, self.alerts = counted
        self.stale, self.durations, self.duration_sums = stale, durations, duration_sums
        self.last_id = self.saved_id = last_id

    def _save(self, caught_up: bool) -> None:
        """Save what is counted, if it moved on and the last save is ``checkpoint_every`` old, or
        the counters have caught up with the history since the last save. A save that fails is
        left to the next scrape: the counters it would have saved are in hand."""
        due = time.monotonic() - self.saved_at >= self.checkpoint_every or (caught_up and not self.saved_caught_up)
        if self.last_id <= self.saved_id or not due:
            return
        state = {
            "finished": _rows(self.finished), "recoveries": _rows(self.recoveries), "failures": _rows(self.failures),
            "compensations": _rows(self.compensations), "alerts": _rows(self.alerts), "stale": self.stale,
            "durations": self.durations, "duration_sums": self.duration_sums,
        }
        try:
            self.sas.store.save_checkpoint(CHECKPOINT, self.last_id, state)
        except SQLAlchemyError as exc:
            log.warning("the counters' checkpoint was not saved (%s); the next scrape tries again",
                        str(exc).splitlines()[0])
            return
        self.saved_id, self.saved_at = self.last_id, time.monotonic()
        self.saved_caught_up = self.saved_caught_up or caught_up

    def _count(self, e: HistoryEvent) -> None:
        detail = e.detail if isinstance(e.detail, dict) else {}
        if e.kind == EventKind.ALERT:
            self.alerts[(str(detail.get("kind", "unknown")),)] += 1
        elif e.kind == EventKind.STALE_REPLY:
            self.stale += 1
        elif e.kind != EventKind.TRANSITION:
            return
        elif e.position is None:
            workflow = e.workflow or "unknown"
            if e.to_state in TERMINAL_RUN_STATES:
                self.finished[(workflow, e.to_state)] += 1
            elif e.to_state == RunState.COMPENSATING:
                self.compensations[(workflow,)] += 1
        else:
            agent = e.agent or "unknown"
            if (e.from_state, e.to_state) == (StepState.RUNNING, StepState.COMPLETED) and e.dispatched_at is not None:
                self._observe(agent, max(e.at - e.dispatched_at, 0.0))
            elif (e.from_state, e.to_state) == (StepState.RUNNING, StepState.PENDING) and "reason" in detail:
                self.recoveries[(agent, cause_of(detail))] += 1
            elif e.to_state == StepState.FAILED:
                self.failures[(agent,)] += 1

    def _observe(self, agent: str, seconds: float) -> None:
        counts = self.durations.setdefault(agent, [0] * (len(BUCKETS) + 1))
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
        self.duration_sums[agent] = self.duration_sums.get(agent, 0.0) + seconds

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            # Counters appear only once they hold the whole history: a counter climbing through
            # the history over several scrapes would read to rate() as a burst of activity, while
            # one that reappears at its full value after a gap continues where it left off.
            if not self.restored:
                self._restore()
            caught_up = self.follow()
            self._save(caught_up)
            if caught_up:
                yield from self._counters()
        yield GaugeMetricFamily("sas_metrics_caught_up", "1 once the counters hold the store's whole history "
                                "(they are left out until then), 0 while the dashboard is still reading it",
                                value=1 if caught_up else 0)
        yield from self._gauges()

    def _counters(self) -> Iterator[Metric]:
        yield family(CounterMetricFamily, "sas_runs_finished", "Runs that reached a terminal state",
                     ["workflow", "state"], self.finished.items())
        yield family(CounterMetricFamily, "sas_recoveries", "Attempts given up and retried, by cause",
                     ["agent", "cause"], self.recoveries.items())
        yield family(CounterMetricFamily, "sas_step_failures", "Steps failed for good", ["agent"],
                     self.failures.items())
        yield family(CounterMetricFamily, "sas_compensations", "Runs that started being undone", ["workflow"],
                     self.compensations.items())
        yield family(CounterMetricFamily, "sas_alerts", "Alerts raised, by kind", ["kind"], self.alerts.items())
        yield CounterMetricFamily("sas_stale_replies", "Late or duplicate replies refused by the fence",
                                  value=self.stale)
        durations = HistogramMetricFamily("sas_step_duration_seconds", "Step attempts, dispatch to completion",
                                          labels=["agent"])
        for agent, counts in sorted(self.durations.items()):
            cumulative, buckets = 0, []
            for bound, n in zip([*map(str, BUCKETS), "+Inf"], counts, strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            durations.add_metric([agent], buckets, sum_value=self.duration_sums[agent])
        yield durations

    def _gauges(self) -> Iterator[Metric]:
        yield family(GaugeMetricFamily, "sas_runs",
                     "Runs not finished (pending, processing, compensating) or in error and not rerun, "
                     "by workflow and state", ["workflow", "state"],
                     (((workflow, state), n) for workflow, state, n in self.observer.open_runs_by_workflow_and_state()))
        yield family(GaugeMetricFamily, "sas_alerts_current",
                     "Alerts whose run is in error (not rerun) or not finished, by kind", ["kind"],
                     (((kind,), n) for kind, n in self.observer.current_alerts_by_kind()))
        waiting = dict(self.observer.waiting_by_kind())
        yield family(GaugeMetricFamily, "sas_runs_waiting",
                     "Runs waiting in the store now: asleep, for an event, for a slot of their concurrency key",
                     ["kind"], (((kind,), waiting.get(kind, 0)) for kind in ("sleep", "event", "slot")))
        now = self.observer.now()
        supervisors = self.observer.supervisors(self.sas.settings.supervisor_interval)
        yield family(CounterMetricFamily, "sas_supervisor_sweeps", "Sweeps made by each Supervisor process",
                     ["instance"], (((sup.instance,), sup.sweeps) for sup in supervisors))
        yield family(GaugeMetricFamily, "sas_supervisor_last_sweep_age_seconds",
                     "Seconds since each Supervisor last swept", ["instance"],
                     (((sup.instance,), max(now - sup.last_sweep_at, 0.0)) for sup in supervisors))
        yield family(GaugeMetricFamily, "sas_breaker_state", "Agents' circuit breakers: 0 closed, 1 half-open, 2 open",
                     ["agent"], (((name,), BREAKER_STATES.get(agent.breaker.state, 0))
                                 for name, agent in self.sas.agents.items()
                                 if agent.breaker is not None))
        agents = backlog(self.sas.store, tuple(self.sas.agents))
        yield family(GaugeMetricFamily, "sas_agent_backlog",
                     "Each agent's live steps: due to be sent, dispatched (queued or being worked on), retrying "
                     "(backing off)", ["agent", "state"],
                     (((a.agent, state), getattr(a, state))
                      for a in agents for state in BACKLOG_STATES))
        yield family(GaugeMetricFamily, "sas_agent_outstanding",
                     "Each agent's steps to take now (due + dispatched): what its workers scale on", ["agent"],
                     (((a.agent,), a.outstanding) for a in agents))
        yield family(GaugeMetricFamily, "sas_agent_oldest_dispatched_seconds",
                     "Seconds since each agent's longest-dispatched running step was sent", ["agent"],
                     (((a.agent,), a.oldest) for a in agents))
        checks = self._doctor()
        if checks:  # none while no examination has answered
            yield family(GaugeMetricFamily, "sas_doctor_problems", "What sas doctor finds wrong, by check (0: healthy)",
                         ["check"], (((c.name,), c.count) for c in checks if c.count is not None))
            yield GaugeMetricFamily("sas_doctor_ok", "1 when every check of sas doctor holds, else 0",
                                    value=1 if all(c.ok for c in checks) else 0)

    def _doctor(self) -> list[Check]:
        """The latest examination of ``sas doctor``'s checks. A scrape that comes ``doctor_every``
        seconds or more after the last began starts the next, in a thread of its own, and answers
        with the last one's findings: it does not wait for it (it reads the store and asks the
        workers, for up to a second), so the series a fleet scales on stay prompt. Only while no
        examination has answered — the first, or after one failed — does a scrape wait, up to
        :data:`FIRST_EXAMINATION_WAIT` seconds."""
        with self.doctor_lock:
            if self.examining is None and (self.examined is None
                                           or time.monotonic() - self.examination_began >= self.doctor_every):
                self.examination_began = time.monotonic()
                self.examining = threading.Thread(target=self._examine, name="sas-metrics-doctor", daemon=True)
                self.examining.start()
            examining = self.examining
        if self.examined is None and examining is not None:
            examining.join(FIRST_EXAMINATION_WAIT)
        return self.examined or []

    def _examine(self) -> None:
        try:
            self.examined = self.sas.doctor.examine(timeout=1.0, since=DOCTOR_SINCE)
        except Exception:  # no findings rather than old ones: the doctor's series are left out
            self.examined = None
            log.exception("metrics: sas doctor's examination failed")
        finally:
            with self.doctor_lock:
                self.examining = None


def cause_of(detail: dict[str, Any]) -> str:
    """A recovery's cause as a label: one of :class:`Cause`'s values, never free text (a deferral
    written before causes were codes held the breaker's message)."""
    reason = str(detail.get("reason"))
    if reason in CAUSES:
        return reason
    return Cause.DEFERRED.value if "deferred" in detail else "other"


def family(kind: type[CounterMetricFamily] | type[GaugeMetricFamily], name: str, documentation: str,
           labels: list[str], samples: Iterable[tuple[Sequence[str], float]]) -> Metric:
    """A metric family with one sample per ``(label values, value)``, in label order."""
    metric = kind(name, documentation, labels=labels)
    for key, value in sorted(samples):
        metric.add_metric(list(key), value)
    return metric


def _rows(counts: Counter[Any]) -> list[list[Any]]:
    """A counter keyed by label values as JSON: one ``[*labels, count]`` row a key."""
    return [[*key, n] for key, n in sorted(counts.items())]


def _counts(rows: list[list[Any]]) -> Counter[Any]:
    return Counter({tuple(row[:-1]): int(row[-1]) for row in rows})


def registry_for(sas: SasApp, margin: float = MARGIN) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(StoreCollector(sas, margin))
    return registry
