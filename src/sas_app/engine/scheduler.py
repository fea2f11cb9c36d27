"""The Scheduler: runs each workflow's steps — one after another, or side by side where a step
waits for several (a join) or fans out over a list — recording state before acting.

Celery tasks on the ``sas.scheduler`` queue. Every handler is one transaction that locks the run,
makes fenced transitions and commits; only then does it send the next message. A message lost
after the commit is recovered by the Supervisor; a duplicate or late one is refused by the fence.

When a run fails for good (a non-transient fault, a step past its failure threshold, a cancel),
the steps whose effects may have happened are undone, last first: each undo is a compensation row
of its own, dispatched and supervised exactly like a step (complete-by, attempts, fencing, its
own idempotency key). The run ends ``compensated`` (``cancelled`` after a cancel), or ``error``
with an alert if an undo fails too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sas_app import fault_points
from sas_app.engine.alerts import Alerts
from sas_app.engine.graph import Graph
from sas_app.engine.planner import Dispatch, HasAction, Moves, Planner
from sas_app.engine.recovery import fail_run, recover_step
from sas_app.errors import InvalidSignal, UnknownRun
from sas_app.messaging.fault_log import from_message as fault_summary
from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import (
    ADVANCE,
    ADVANCE_EACH,
    STEP_DEFERRED,
    STEP_DONE,
    STEP_FAILED,
    STEP_FAULTS,
    STEP_LOST,
    STEP_NOT_YET,
    Advance,
    AgentMessage,
    Router,
    keeping,
)
from sas_app.settings import Settings, instance_id
from sas_app.states import LIVE_RUN_STATES, Cause, EventKind, RunState, SignalStatus, StepState
from sas_app.store import Completion, NewRun, RunRow, StepRow, Store, Tx, starts_in_one_statement

if TYPE_CHECKING:
    from celery import Celery

    from sas_app.definitions.workflow import Workflow

log = logging.getLogger(__name__)


def well_formed(kind: str, run_id: Any, *numbers: Any) -> bool:
    """A Scheduler message names a run (an id string) and, for a reply, a step position and an
    attempt (integers). Anything else is logged and dropped before it reaches the store."""
    if isinstance(run_id, str) and 0 < len(run_id) <= 64 and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers
    ):
        return True
    log.error("%s rejected a malformed message: run_id must be an id and position and attempt "
              "non-negative integers, got %r", kind, (run_id, *numbers))
    return False


class Scheduler:
    @property
    def instance_id(self) -> str:
        return instance_id()

    def __init__(self, store: Store, celery: Celery, settings: Settings, alerts: Alerts, router: Router,
                 has_action: HasAction | None = None, workflows: Mapping[str, Workflow] | None = None) -> None:
        self.store = store
        self.celery = celery
        self.settings = settings
        self.alerts = alerts
        self.router = router
        self.planner = Planner(settings, alerts, has_action, workflows)
        self._register_tasks()

    def _register_tasks(self) -> None:
        # Late acks: a scheduler killed mid-handler leaves the message to be redelivered; every
        # handler is fenced, so running it twice is harmless. A reply takes fields it does not know
        # (``**newer``): one from an agent of a newer release, during a rolling upgrade, is handled
        # with what this release knows rather than refused and left to the Supervisor.
        options: dict[str, Any] = {
            "shared": False, "acks_late": True, "reject_on_worker_lost": True, "ignore_result": True,
        }

        @self.celery.task(name=ADVANCE, **options)
        def advance(run_id: str) -> None:
            if well_formed("advance", run_id):
                self.advance(run_id)

        @self.celery.task(name=ADVANCE_EACH, **options)
        def advance_each(run_ids: list[str]) -> None:
            if isinstance(run_ids, list):
                self.advance_each([run_id for run_id in run_ids if well_formed("advance_each", run_id)])

        @self.celery.task(name=STEP_DONE, **options)
        def step_done(run_id: str, position: int, attempt: int, result: Any = None,
                      results: dict[str, Any] | None = None, faults: Any = None, workflow: Any = None,
                      notify: Any = True, **newer: Any) -> None:
            if well_formed("step_done", run_id, position, attempt) and (results is None or isinstance(results, dict)):
                self.step_done(run_id, position, attempt, result, results, fault_summary(faults),
                               workflow if isinstance(workflow, str) else None, notify=notify is not False)

        @self.celery.task(name=STEP_FAILED, **options)
        def step_failed(run_id: str, position: int, attempt: int, error: str = "", faults: Any = None,
                        **newer: Any) -> None:
            if well_formed("step_failed", run_id, position, attempt):
                self.step_failed(run_id, position, attempt, str(error), fault_summary(faults))

        @self.celery.task(name=STEP_DEFERRED, **options)
        def step_deferred(run_id: str, position: int, attempt: int, delay: float = 1.0, reason: str = "",
                          faults: Any = None, **newer: Any) -> None:
            if well_formed("step_deferred", run_id, position, attempt) and isinstance(delay, (int, float)):
                self.step_deferred(run_id, position, attempt, delay, str(reason), fault_summary(faults))

        @self.celery.task(name=STEP_NOT_YET, **options)
        def step_not_yet(run_id: str, position: int, attempt: int, after: float | None = None, detail: str = "",
                         faults: Any = None, **newer: Any) -> None:
            if well_formed("step_not_yet", run_id, position, attempt) and (
                    after is None or (isinstance(after, (int, float)) and not isinstance(after, bool) and after > 0)):
                self.step_not_yet(run_id, position, attempt, after, str(detail)[:200], fault_summary(faults))

        @self.celery.task(name=STEP_FAULTS, **options)
        def step_faults(run_id: str, position: int, attempt: int, faults: Any = None, gave_up: Any = False,
                        **newer: Any) -> None:
            summary = fault_summary(faults)
            if well_formed("step_faults", run_id, position, attempt) and (summary is not None or gave_up is True):
                self.step_faults(run_id, position, attempt, summary, gave_up=gave_up is True)

        @self.celery.task(name=STEP_LOST, **options)
        def step_lost(run_id: str, position: int, attempt: int, reason: str = "", **newer: Any) -> None:
            if well_formed("step_lost", run_id, position, attempt):
                self.step_lost(run_id, position, attempt, str(reason))

    # -- handlers ---------------------------------------------------------------------------

    def advance(self, run_id: str) -> None:
        """Claim the run if it is pending (with a concurrency key, once a slot is free) and
        dispatch what may start now."""
        with self.store.begin() as tx:
            moves = self.moves(tx, run_id)
        self.after_commit(tx, moves)

    def advance_each(self, run_ids: list[str]) -> None:
        """:meth:`advance` for each of ``run_ids`` (a batch the Supervisor recovered): the retried
        steps of plain straight-line runs start again together, in one transaction
        (:meth:`RetryTx.restart_retries`); every other run is advanced on its own."""
        with self.store.begin() as tx:
            restarted = tx.retries.restart_retries(run_ids, self.instance_id)
            moves = Moves()
            for run, step, steps in restarted:
                tx.runs.looked_at(run)
                moves.extend(self.planner.dispatch(tx, run, step, Graph(steps).results()))
        self.after_commit(tx, moves)
        done = {run.id for run, _, _ in restarted}
        for run_id in dict.fromkeys(run_ids):
            if run_id not in done:
                self._advance_or_log(run_id)  # the others still go on

    def moves(self, tx: Tx, run_id: str) -> Moves:
        """:meth:`advance` inside the caller's transaction (a submission's, which so starts its run
        in the transaction that writes it): what to send once ``tx`` has committed."""
        run, first = tx.hot_path.start_new_run(run_id, self.instance_id)  # a new run: claimed, locked, started
        if run is None:
            run = self._lock_or_claim_slot(tx, run_id)
        if run is None:
            return Moves()
        if run.process_state not in LIVE_RUN_STATES:
            log.info("advance: run %s is %s; nothing to do", run_id, run.process_state)
            return Moves()
        return self._first_moves(tx, run, first)

    def _first_moves(self, tx: Tx, run: RunRow, first: StepRow | None) -> Moves:
        """A run just claimed: the first step the store marked running dispatched, or, when it
        marked none (a graph, a paused run), what the planner starts."""
        return self.planner.dispatch(tx, run, first, {}) if first is not None else self.planner.next(tx, run)

    def submitted(self, new: NewRun) -> tuple[RunRow, bool, Tx, Moves] | None:
        """A submission's run written already started, where the store can in one statement that
        is its own transaction (on PostgreSQL, a straight line:
        :meth:`SubmissionTx.insert_started_run` in :meth:`Store.alone`): ``(run, created, the
        transaction, what to send now it has committed)``. None: write it in a transaction, with
        ``insert_run`` and :meth:`moves`."""
        if not (self.store.is_postgresql and starts_in_one_statement(new)):
            return None
        with self.store.alone() as tx:
            written = tx.submission.insert_started_run(new, self.instance_id)
        assert written is not None
        run, first, created = written
        if not created:
            return run, False, tx, Moves()
        assert first is not None  # the statement starts the first step of every run it writes
        moves, refused = self._started_alone(run, [first], {})
        self._refuse_started(run.id, refused, {})
        return run, True, tx, moves

    def _started_alone(self, run: RunRow, started: list[StepRow],
                       results: dict[str, Any]) -> tuple[Moves, list[StepRow]]:
        """Of the steps a statement of its own has started and committed: the messages of those
        this deployment can run, and those whose actions have left its code."""
        moves, refused = Moves(), []
        for step in started:
            if self.planner.refusal(step) is None:
                moves.messages.append(Dispatch(run, step, results))
            else:
                refused.append(step)
        return moves, refused

    def _refuse_started(self, run_id: str, refused: list[StepRow], results: dict[str, Any]) -> None:
        """Steps a statement of its own started whose actions have left the deployed code: each
        fails (and the run is undone) in a transaction of its own, as :meth:`Planner.dispatch`
        would have in the statement's. Should that fail, the step stays running with no message:
        the Supervisor finds it at its complete-by, and the planner refuses it then."""
        for step in refused:
            try:
                with self.store.begin() as tx:
                    run = tx.runs.lock_run(run_id)
                    moves = (self.planner.dispatch(tx, run, step, results)
                             if run is not None and run.process_state in LIVE_RUN_STATES else Moves())
                self.after_commit(tx, moves)
            except Exception:
                log.exception("run %s: refusing step %s failed; the Supervisor finds it at its complete-by",
                              run_id, step.name)

    def _advance_or_log(self, run_id: str) -> None:
        """:meth:`advance`, where what asked for it has committed already: a failure is logged, and
        the Supervisor asks about the run again."""
        try:
            self.advance(run_id)
        except Exception:
            log.exception("advance: run %s", run_id)

    def step_done(
        self, run_id: str, position: int, attempt: int, result: Any, results: dict[str, Any] | None = None,
        faults: dict[str, Any] | None = None, workflow: str | None = None, *, notify: bool = True,
    ) -> None:
        """An agent's success reply: record it if that attempt still runs, then go on.

        The store completes the step and starts what follows on the hot path in one call
        (:meth:`HotPathTx.complete_and_advance`: on PostgreSQL one statement). When the run's
        ``workflow`` (as the agent received it) is a straight line here and the reply carries the
        earlier results and no faults, that statement is tried as a transaction of its own first
        (:meth:`HotPathTx.complete_alone`), which it is unless the completion writes more: a
        narrower one where the step's message said the run notifies no one (``notify`` false),
        for the last step of the workflow or one before it. ``results`` (the earlier steps'
        results, as the agent received them) then let the next step be dispatched without
        reading the run's steps."""
        line = self._straight_line(workflow) if self.store.is_postgresql else None
        if faults is None and results is not None and line is not None:
            with self.store.alone() as tx:
                done = tx.hot_path.complete_alone(run_id, position, attempt, result, self.instance_id,
                                                  quiet=not notify, last=position == len(line.steps) - 1)
            if done is not None and done.run is not None:
                earlier = self._earlier(tx, done, results, result)
                moves, refused = self._started_alone(done.run, done.started, earlier)
                if done.finished:
                    log.info("run %s (%s %s) processed", run_id, done.run.workflow, done.run.business_key)
                self.after_commit(tx, moves)  # the completion's notifications, then the next step's message
                self._refuse_started(run_id, refused, earlier)
                if done.plan:  # the next step changed between the statement's snapshot and its lock
                    self._advance_or_log(run_id)
                return
        with self.store.begin() as tx:
            done = tx.hot_path.complete_and_advance(run_id, position, attempt, result, self.instance_id)
            self._faults(tx, done.run, position, attempt, faults)
            if done.step is None or done.run is None:
                self._stale(tx, done.run, position, attempt, "step_done")
                return
            gone = next((s for s in done.started if self.planner.refusal(s)), None)
            if gone is not None:  # its action left the deployed code: it fails, and the run is undone
                moves = self.planner.dispatch(tx, done.run, gone, {})
            else:
                moves = Moves()
                if done.started:
                    earlier = self._earlier(tx, done, results, result)
                    moves.messages += [Dispatch(done.run, step, earlier) for step in done.started]
                if done.finished:
                    log.info("run %s (%s %s) processed", run_id, done.run.workflow, done.run.business_key)
                elif done.plan:  # the run row is as locked: completing a step changed only steps
                    moves.extend(self.planner.next(tx, done.run))
        self.after_commit(tx, moves)

    def _straight_line(self, workflow: str | None) -> Workflow | None:
        """The deployed definition of ``workflow``, if it is a straight line."""
        known = self.planner.workflows
        if workflow is None or known is None or workflow not in known or not known[workflow].is_linear:
            return None
        return known[workflow]

    @staticmethod
    def _earlier(tx: Tx, done: Completion, results: dict[str, Any] | None, result: Any) -> dict[str, Any]:
        """The results the steps ``done`` started are told: the store's, the agent's (``results``,
        as it received them) with the step's own, or else read from the run's steps (in ``tx``)."""
        if not done.started:
            return {}
        if done.results is not None:
            return done.results
        assert done.step is not None
        if results is None:
            return Graph(tx.steps.steps_of(done.started[0].run_id)).results()
        return {**results, done.step: result}

    def step_failed(self, run_id: str, position: int, attempt: int, error: str,
                    faults: dict[str, Any] | None = None) -> None:
        """An agent's non-transient fault: the step fails with one alert, and the run is undone
        (or goes to ``error`` when there is nothing to undo, or when an undo itself failed)."""
        with self.store.begin() as tx:
            run = tx.runs.lock_run(run_id)
            self._faults(tx, run, position, attempt, faults)
            failed = None
            if run is not None and run.process_state in LIVE_RUN_STATES:
                failed = tx.steps.fail_step(run_id, position, attempt, error, actor=self.instance_id,
                                            count_failure=True)
            if run is None or failed is None:
                self._stale(tx, run, position, attempt, "step_failed")
                return
            moves = self._failed_for_good(tx, run, failed, f"step {failed.name!r} failed: {error}")
        self.after_commit(tx, moves)

    def step_deferred(self, run_id: str, position: int, attempt: int, delay: float, reason: str,
                      faults: dict[str, Any] | None = None) -> None:
        """The agent did not call its service (its circuit breaker is open): the step waits
        ``delay`` seconds, back in pending, without counting a failure."""
        with self.store.begin() as tx:
            run = tx.runs.lock_run(run_id)
            self._faults(tx, run, position, attempt, faults)
            deferred = False
            if run is not None and run.process_state in LIVE_RUN_STATES:
                deferred = tx.steps.defer_step(run_id, position, attempt, max(float(delay), 0.0),
                                               self.settings.pickup_timeout, reason, actor=self.instance_id)
            if run is None or not deferred:
                self._stale(tx, run, position, attempt, "step_deferred")
                return
        self.after_commit(tx, Moves([Advance(run_id, Publish.BACKOFF, max(float(delay), 0.0))]))

    def step_not_yet(self, run_id: str, position: int, attempt: int, after: float | None, detail: str = "",
                     faults: dict[str, Any] | None = None) -> None:
        """A polling step's action answered "not yet": the step waits in the store until its next
        call (``after`` seconds, or its ``Poll.every``), no failure counted. Past its ``max_wait``
        it fails for good, with one alert, and the run is undone; a step that does not poll and
        answers "not yet" fails so too, naming the mistake."""
        with self.store.begin() as tx:
            run = tx.runs.lock_run(run_id)
            self._faults(tx, run, position, attempt, faults)
            step = tx.steps.running_step(run_id, position, attempt) if run is not None else None
            if run is None or step is None or run.process_state not in LIVE_RUN_STATES:
                self._stale(tx, run, position, attempt, "step_not_yet")
                return
            waiting = None
            if step.poll is not None:
                wait = float(after if after is not None else step.poll["every"])
                waiting = tx.steps.poll_later(step, wait, self.instance_id, detail)
                reason = (f"step {step.name!r}: its job was not done {float(step.poll['max_wait']):g} s after its "
                          f"first 'not yet' (max_wait), after {step.polls + 1} polls")
            else:
                reason = (f"step {step.name!r}: its action answered 'not yet' (NotYet), but the step does not poll: "
                          "give it poll=Poll(every, max_wait)")
            if waiting is None:
                failed = tx.steps.fail_step(run_id, position, attempt, reason, actor=self.instance_id,
                                            count_failure=True)
                if failed is None:
                    self._stale(tx, run, position, attempt, "step_not_yet")
                    return
                log.warning("run %s: %s", run_id, reason)
                moves = self._failed_for_good(tx, run, failed, reason)
            else:
                moves = Moves()
                if waiting.not_before is not None and waiting.not_before - tx.now() <= self.settings.retry_backoff_max:
                    moves.messages.append(Advance(run_id, Publish.BACKOFF, waiting.not_before - tx.now()))
        self.after_commit(tx, moves)

    def step_lost(self, run_id: str, position: int, attempt: int, reason: str) -> None:
        """The worker process running this attempt died (reported by its worker's main process).

        Handled as the Supervisor handles an attempt past its complete-by, only sooner: one failure
        counted, then a retry after a back-off, or, at the step's threshold, the step fails and the
        run is undone. A step that kills every worker it runs on (a poison step) therefore costs at
        most ``max_failures`` worker processes, spaced by the back-off, never a redelivery loop."""
        with self.store.begin() as tx:
            run = tx.runs.lock_run(run_id)
            step = tx.steps.running_step(run_id, position, attempt) if run is not None else None
            if run is None or step is None or run.process_state not in LIVE_RUN_STATES:
                self._stale(tx, run, position, attempt, "step_lost")
                return
            outcome = recover_step(tx, self.alerts, self.settings, step, Cause.WORKER_LOST, reason,
                                   actor=self.instance_id)
        log.warning("run %s step %s attempt %s: worker lost (%s); %s", run_id, position, attempt, reason,
                    "failed for good" if outcome.failed else f"retry in {outcome.backoff:.1f}s")
        retry: list[Dispatch | Advance] = [] if outcome.escalated else [Advance(run_id, Publish.BACKOFF,
                                                                               outcome.backoff)]
        self.after_commit(tx, Moves(retry, [outcome.alert]))

    def start_late(self, run_id: str, position: int, attempt: int) -> float | None:
        """An agent took this attempt's message late, having waited in the queue: the attempt
        gets a whole timeout from now (no failure counted) if the store still wants it and its
        complete-by passed at most SAS_QUEUE_WAIT_MAX ago; when it now ends, or None to drop it."""
        with self.store.begin() as tx:
            return tx.steps.start_late(run_id, position, attempt, self.settings.queue_wait_max, self.instance_id)

    def resend(self, message: AgentMessage) -> bool:
        """Publish ``message``, a step an agent's process took over from a reply and cannot run
        now: a worker takes it from the agent's queue as any other. Whether the broker took it
        (if not, the Supervisor recovers the step at its complete-by)."""
        with keeping(None):
            return self.router.send(message)

    def still_running(self, run_id: str, position: int, attempt: int) -> bool:
        """Whether the store still waits for this attempt (an agent got its message a second time)."""
        with self.store.begin() as tx:
            return tx.steps.attempt_running(run_id, position, attempt)

    def step_faults(self, run_id: str, position: int, attempt: int, faults: dict[str, Any] | None = None,
                    gave_up: bool = False) -> None:
        """An attempt that ended without a reply: its transient faults written to the run's history
        and, when its agent ``gave_up`` at complete-by, a ``gave_up`` event that makes it a failed
        attempt (the step itself is the Supervisor's, at its complete-by)."""
        with self.store.begin() as tx:
            run = tx.runs.lock_run(run_id)
            self._faults(tx, run, position, attempt, faults)
            if gave_up and run is not None:
                tx.event(run.id, position, EventKind.GAVE_UP, None, None, attempt=attempt, actor=self.instance_id)

    def signal(self, run_id: str, event: str, payload: Any, by: str) -> str:
        """Record a signal for the run's wait for ``event`` and, if the run is waiting there, end
        the wait and go on — one transaction. Returns the signal's status: ``consumed``, ``kept``
        (the run has not reached the wait, or this process has not the run's workflow: the
        Scheduler consumes it) or ``ignored`` (the wait has had its signal, has ended or timed
        out). Refused with :class:`InvalidSignal` (nothing written) when the run has ended or
        never waits for ``event``."""
        with self.store.begin() as tx:
            run = tx.runs.lock_run(run_id)
            if run is None:
                raise UnknownRun(f"no run with id {run_id!r}")
            what = f"run {run.id} ({run.workflow} {run.business_key})"
            if run.process_state not in (RunState.PENDING, RunState.PROCESSING):
                raise InvalidSignal(f"{what} is {run.process_state}: it takes no more signals")
            steps = tx.steps.steps_of(run_id)
            wait = next((s for s in steps if s.event == event and not s.is_undo), None)
            if wait is None:
                events = sorted(s.event for s in steps if s.event is not None)
                raise InvalidSignal(f"{what} never waits for event {event!r}; it waits for "
                                    f"{', '.join(map(repr, events)) if events else 'no event'}")
            signal_id, status = tx.signals.record_signal(wait, payload, by)
            moves = Moves()
            if status == SignalStatus.KEPT and wait.state == StepState.PENDING:
                known = self.planner.workflows is not None and run.workflow in self.planner.workflows
                if known:  # this process has the run's code: it ends the wait and starts what follows
                    moves = self.planner.next(tx, run)
                    status = tx.signals.signal_status(signal_id)
                else:  # kept: the Scheduler consumes it
                    moves.messages.append(tx.runs.ask(run.id, Publish.SIGNALLED, self.settings.pickup_timeout))
        log.info("%s: signal %r %s", what, event, status)
        self.after_commit(tx, moves)
        return status

    # -- internals ---------------------------------------------------------------------------

    def _lock_or_claim_slot(self, tx: Tx, run_id: str) -> RunRow | None:
        """The run, locked; a pending run with a concurrency key claimed if a slot is free (None
        if it must wait: it stays pending, parked)."""
        run = tx.runs.lock_run(run_id)
        if run is None:
            log.warning("advance: no run %s; message ignored", run_id)
        elif run.process_state == RunState.PENDING and run.slot is not None:
            run = tx.slots.claim_slot(run, self.settings.pickup_timeout, self.instance_id)
            if run is None:
                log.info("advance: run %s waits for a slot of its concurrency key", run_id)
        return run

    def _faults(self, tx: Tx, run: RunRow | None, position: int, attempt: int,
                faults: dict[str, Any] | None) -> None:
        """An attempt's transient faults, as one event of its run's history (one INSERT, only when
        the agent met any, for a run that exists: ``run``, as the handler read it)."""
        if faults and run is not None:
            tx.event(run.id, position, EventKind.FAULTS, None, None, attempt=attempt, actor=self.instance_id,
                     detail=faults)

    def _failed_for_good(self, tx: Tx, run: RunRow, failed: StepRow, reason: str) -> Moves:
        """``failed`` has failed for good: its alert, the run undone (or in error), and what that
        starts — the first undo."""
        alert = fail_run(tx, self.alerts, self.settings, run, failed, reason, actor=self.instance_id)
        after = tx.runs.lock_run(run.id)
        moves = self.planner.next(tx, after) if after is not None else Moves()
        moves.alerts.insert(0, alert)
        return moves

    def _stale(self, tx: Tx, run: RunRow | None, position: int, attempt: int, kind: str) -> None:
        if run is None:
            log.warning("%s for unknown run; ignored", kind)
            return
        log.info("%s for run %s step %s attempt %s is stale; ignored", kind, run.id, position, attempt)
        tx.event(run.id, position, EventKind.STALE_REPLY, None, None, attempt=attempt, actor=self.instance_id,
                 detail={"message": kind})

    def after_commit(self, tx: Tx, moves: Moves) -> None:
        """Once the transaction has committed: its alerts, its notifications, then its messages."""
        for alert in moves.alerts:
            self.alerts.emit(alert)
        if not moves.messages and not tx.outbox and not tx.follow_ups:
            return
        fault_points.hit("scheduler.after_commit")
        self.router.after_commit(tx.outbox, *(m.message() if isinstance(m, Dispatch) else m for m in moves.messages),
                                 *tx.follow_ups)
