"""A test environment for your own :class:`SasApp`: its agents, undos, workflows, schedules and
tables declared again on an app of the environment's own — the real Scheduler, planner, agents and
Supervisor, an in-memory broker whose messages run in this process, an embedded store in a
temporary folder (or a schema of its own in your PostgreSQL database) — on a :class:`VirtualClock`
that moves only when there is nothing to do now.

>>> env = Environment(sas)                                   # sas: your app
>>> env.stub(payment.charge, raises=TransientError("busy"))  # or returns=..., hangs=True, ...
>>> view = env.run(orders, {"amount": 5})                    # to its end, skipping time
>>> view.state, [c.attempt for c in env.calls(payment.charge)]

Your app is only read: the environment's store and broker are its own, while your actions (unless
stubbed) do what they do. Circuit breakers are off in it (their reset runs on real time): a
service stubbed down is met with retries and expiries, step by step.

A run waits no real time: whenever no message can run now, the clock moves to the next thing due —
a complete-by, a back-off, a sleep's end, a wait's timeout, a deadline, an escalation, a
schedule's tick — and the Supervisor sweeps, as it would at that moment.
"""

from __future__ import annotations

import atexit
import math
import shutil
import tempfile
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import replace
from datetime import timedelta
from functools import cache
from itertools import count
from pathlib import Path
from typing import Any

from sas_app.agents.worker_lost import report_lost
from sas_app.app import SasApp
from sas_app.definitions.actions import ActionName, AgentCall, UndoAction
from sas_app.definitions.steps import Step, WaitFor, seconds_of
from sas_app.definitions.workflow import Workflow, workflow_name
from sas_app.engine.alerts import Alert
from sas_app.interfaces.client import RunView
from sas_app.interfaces.notifications import Notifications
from sas_app.interfaces.schedules import Overlap
from sas_app.interfaces.signals import SignalReceipt
from sas_app.messaging import memory_transport
from sas_app.settings import Settings
from sas_app.states import TERMINAL_RUN_STATES, RunState
from sas_app.store.migrate import migrate
from sas_app.testing.clock import VirtualClock
from sas_app.testing.postgres import ScratchSchema
from sas_app.testing.pump import Message, Pump
from sas_app.testing.stubs import HANG, WORKER_LOST, Call, Recorder, Stub, WorkerDied, _Exhausted

_UNSET: Any = object()
#: at most this many times the clock moves while one call drives runs to their end
MOST_MOVES = 1000


@cache
def _schema_template() -> Path:
    """A store with the current schema, made once per process; each environment copies it."""
    folder = Path(tempfile.mkdtemp(prefix="sas-test-schema-"))
    atexit.register(shutil.rmtree, folder, True)
    migrate(f"sqlite:///{folder / 'state.db'}")
    return folder / "state.db"


class Environment:
    """Your app's workflows on the real engine, a virtual clock and an in-memory broker (see the
    module's docstring). ``start`` sets the clock (epoch seconds; default now), or ``clock`` is
    one of your own (a :class:`VirtualClock`, shared, say, with what your test stubs). ``database_url``, a
    PostgreSQL database's, puts the store in a schema of the environment's own there (created and
    migrated now, dropped on close; the user needs the right to create schemas); without it the
    store is SQLite in a temporary folder. Close it when done (the pytest fixture ``sas_env``
    does)."""

    def __init__(self, app: SasApp, *, start: float | None = None, clock: VirtualClock | None = None,
                 database_url: str | None = None) -> None:
        if start is not None and clock is not None:
            raise ValueError("give the environment a start or a clock, not both")
        self._folder = tempfile.TemporaryDirectory(prefix="sas-test-")
        home = Path(self._folder.name)
        self._schema: ScratchSchema | None = None
        self.clock = clock if clock is not None else VirtualClock(start)
        self.recorder = Recorder(self.clock)
        #: every alert raised, in order
        self.alerts: list[Alert] = []
        try:
            if database_url:
                self._schema = ScratchSchema(database_url)
                store_url = self._schema.url
            else:
                shutil.copyfile(_schema_template(), home / "state.db")
                store_url = f"sqlite:///{home / 'state.db'}"
            self._broker = f"sas-test-{home.name}"  # a virtual host of its own on the in-memory broker
            self.app = SasApp(_test_settings(app.settings, home, store_url, self._broker),
                              main=f"{app.celery.main}-test", clock=self.clock)
            self.app.alerts.hook = self.alerts.append
            self._declare(app)
        except BaseException:
            self._dispose()
            raise
        self.pump = Pump(self.app, on_error=self._on_error, keep_open=True)
        self._keys = count(1)
        self._inboxes: dict[str, tuple[Notifications, list[dict[str, Any]]]] = {}
        self._open = ExitStack()  # the inboxes, closed with the environment

    def _declare(self, app: SasApp) -> None:
        for name, agent in app.agents.items():
            # Its steps' time left measured on the virtual clock, the store's; no circuit breaker:
            # a breaker's reset runs on real time, and would stay open through virtual days; no
            # random jitter in its retries' waits: a test counts the same tries every time.
            options = {**app.agent_options.get(name, {}), "db_clock": self.clock, "breaker_fail_max": 0,
                       "retry_jitter": False}
            copy = self.app.agent(name, **options)
            for action in agent.actions.values():
                fn = self.recorder.wrap(action.qualname, action.fn)
                if isinstance(action, UndoAction):
                    copy.undo(name=action.name)(fn)
                else:
                    copy.action(name=action.name)(fn)
        for metadata in app.tables:
            self.app.register_tables(metadata)
        for workflow in app.workflows.values():
            self.app.register(workflow)
        for schedule in app.schedules.schedules.values():
            self.app.schedule(schedule.name, cron=schedule.cron, payload=schedule.payload,
                              workflow=schedule.workflow, overlap=Overlap(schedule.overlap),
                              catch_up=schedule.catch_up)

    def close(self) -> None:
        self._open.close()
        self.pump.close()
        memory_transport.forget(self._broker)
        self.app.store.dispose()
        self._dispose()

    def _dispose(self) -> None:
        if self._schema is not None:
            self._schema.drop()
        self._folder.cleanup()

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- time -------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The virtual clock: epoch seconds."""
        return self.clock.now

    def advance(self, duration: float | timedelta) -> None:
        """Let ``duration`` pass: everything due meanwhile happens at its time, in order. A call
        that hangs meanwhile takes the clock to its complete-by, which may be past the end."""
        step = float(seconds_of(duration))
        if step < 0:
            raise ValueError(f"time moves forward only: cannot advance by {duration!r}")
        target = self.clock.now + step
        self.settle()
        for _ in range(MOST_MOVES):
            due = self._next_due()
            if due is None or due + VirtualClock.PAST > target:
                break
            self.clock.move_past(due)
            self.settle()
        else:
            raise AssertionError(f"still busy after {MOST_MOVES} moves of the clock: a loop?")
        self.clock.move_to(max(target, self.clock.now))
        self.settle()

    def _next_due(self) -> float | None:
        """When the next thing is due: a row's due time, a message held for its countdown, a
        schedule's tick."""
        now = self.clock.now
        due = [self.app.store.next_due(self.app.settings.pickup_timeout), self.pump.next_held(),
               *(s.next_tick(now) for s in self.app.schedules.schedules.values())]
        return min((t for t in due if t is not None), default=None)

    def _unsent(self, run_id: str) -> bool:
        """Whether a notification of ``run_id``'s is still to be relayed."""
        notes = self.app.store.unsent(older_than=-math.inf, limit=self.app.settings.sweep_batch)
        return any(note.body.get("run_id") == run_id for note in notes)

    def settle(self) -> None:
        """Run every message due now, and what the Supervisor and beat would do now, until
        nothing more can happen without the clock moving."""
        for _ in range(MOST_MOVES):
            ran = self.pump.run_due()
            started = self.app.schedules.tick()
            report = self.app.supervisor.sweep()
            if not (ran or started or report.retried or report.paced or report.failed or report.requeued
                    or report.relayed):
                return
        raise AssertionError(f"still busy after {MOST_MOVES} rounds: a message loop?")

    # -- runs -------------------------------------------------------------------------------

    def start(self, workflow: Workflow | str, payload: Any = None, *, business_key: str | None = None,
              reply_to: str | None = None) -> RunView:
        """Submit a run (its progress notified to ``reply_to``, if given: :meth:`notifications`)
        and run it as far as it goes without the clock moving; the run as it is then."""
        key = business_key if business_key is not None else f"test-{next(self._keys)}"
        if reply_to is not None:
            self._inbox(reply_to)  # the queue exists before the first notification is relayed
        handle = self.app.submit(workflow_name(workflow), {} if payload is None else payload, business_key=key,
                                 reply_to=reply_to)
        self.settle()
        return self.app.get_run(handle.id)

    def run(self, workflow: Workflow | str, payload: Any = None, *, business_key: str | None = None,
            reply_to: str | None = None) -> RunView:
        """Submit a run and drive it to its end, skipping time; the finished run."""
        return self.finish(self.start(workflow, payload, business_key=business_key, reply_to=reply_to))

    def finish(self, run: RunView | str) -> RunView:
        """Drive ``run`` to its end, and its last notification out, moving the clock to the next
        thing due whenever nothing can happen now; the finished run. A run that waits for
        nothing due (a wait with no timeout, a paused run) is an error naming it."""
        run_id = run if isinstance(run, str) else run.id
        for _ in range(MOST_MOVES):
            self.settle()
            view = self.app.get_run(run_id)
            if view.process_state in TERMINAL_RUN_STATES and not self._unsent(run_id):
                return view
            if view.run.paused_by is not None and view.process_state in (RunState.PENDING, RunState.PROCESSING):
                # nothing moves it on but a resume, or its deadline (which undoes it, paused or not)
                if view.run.deadline is None:
                    raise AssertionError(f"run {run_id} ({view.run.workflow}) is paused by {view.run.paused_by}: "
                                         "resume it first")
                if self.clock.now <= view.run.deadline:
                    self.clock.move_past(view.run.deadline)
                    continue
            due = self._next_due()
            if due is None:
                raise AssertionError(f"run {run_id} ({view.run.workflow}) is {view.process_state} and waits for "
                                     "nothing due: signal it, or resume it, first")
            self.clock.move_past(due)
        raise AssertionError(f"run {run_id} still live after {MOST_MOVES} moves of the clock")

    def get_run(self, run: RunView | str) -> RunView:
        """The run as the store holds it now."""
        return self.app.get_run(run if isinstance(run, str) else run.id)

    def signal(self, run: RunView | str, event: WaitFor | str, payload: Any = None, *,
               by: str = "test") -> SignalReceipt:
        """Send ``event`` (the ``WaitFor`` step or its event's name) to ``run`` (early, while it
        waits, or late) and run what it makes due. An
        event the run never waits for, or a run that has ended, is refused as by the app
        (:class:`InvalidSignal`, naming it), nothing written."""
        receipt = self.app.signal(run if isinstance(run, str) else run.id, event, payload, by=by)
        self.settle()
        return receipt

    def notifications(self, reply_to: str) -> list[dict[str, Any]]:
        """Every progress notification relayed so far to ``reply_to`` (runs submitted with it),
        each once, in order. A name no run was submitted with is an error (a misspelled one would
        otherwise read as "nothing was notified")."""
        if reply_to not in self._inboxes and reply_to not in (known := self.app.store.reply_queues()):
            raise KeyError(f"no run was submitted with reply_to {reply_to!r}; runs were with: {known or 'none'}")
        inbox, received = self._inbox(reply_to)
        received += inbox.iter(timeout=0.001)
        return list(received)

    def _inbox(self, reply_to: str) -> tuple[Notifications, list[dict[str, Any]]]:
        if reply_to not in self._inboxes:
            inbox = self._open.enter_context(Notifications(self.app.celery, reply_to))
            self._inboxes[reply_to] = (inbox, [])
        return self._inboxes[reply_to]

    def tick(self) -> list[str]:
        """Start the runs of the schedules' ticks due now (as beat would); their ids."""
        started = self.app.schedules.tick()
        self.settle()
        return started

    # -- agents -----------------------------------------------------------------------------

    def stub(self, action: ActionName | Step | str, returns: Any = _UNSET, *, raises: BaseException | None = None,
             hangs: bool = False, worker_lost: bool = False, sequence: list[Any] | None = None,
             answer: Callable[[AgentCall], Any] | None = None) -> None:
        """Answer every call of ``action`` (``payment.charge``, ``"payment.charge"``, or a step,
        for its action) with one of: ``returns`` a value; ``raises`` an exception (a
        :class:`TransientError` is retried, a :class:`PermanentError` fails the step); ``hangs``
        (the call outlasts its complete-by); ``worker_lost`` (its worker dies); a ``sequence`` of
        answers, one a call (each try of each attempt: values, exceptions, :data:`HANG`,
        :data:`WORKER_LOST`), which must not run out; or ``answer(call)``, a function of the call
        (its ``item``, ``attempt``, ``try_number``…) returning any of those, or raising."""
        qualname = self._known(action)
        given = [returns is not _UNSET, raises is not None, hangs, worker_lost, sequence is not None,
                 answer is not None]
        if sum(given) != 1:
            raise ValueError(f"stub {qualname} with exactly one of returns=, raises=, hangs=, worker_lost=, "
                             "sequence= or answer=")
        if callable(returns):
            raise ValueError(f"stub {qualname}: returns= is the value itself (a step's result is JSON); to "
                             "answer each call from the call, pass answer=")
        if answer is not None:
            self.recorder.stubs[qualname] = Stub(qualname, [], repeat_last=True, answer_of=answer)
            return
        if sequence is not None:
            self.recorder.stubs[qualname] = Stub(qualname, sequence, repeat_last=False)
            return
        given_answer = (returns if returns is not _UNSET else raises if raises is not None else HANG if hangs
                        else WORKER_LOST)
        self.recorder.stubs[qualname] = Stub(qualname, [given_answer], repeat_last=True)

    def unstub(self, action: ActionName | Step | str) -> None:
        """``action`` (or a step's action) runs for real again."""
        self.recorder.stubs.pop(self._known(action), None)

    def calls(self, action: ActionName | Step | str | None = None) -> list[Call]:
        """Every call of ``action`` (of every action, without one), in order: each try of each
        attempt, with its idempotency key, fencing token and input. Given a step, the calls of its
        action made for that step (its branches' too)."""
        if action is None:
            return list(self.recorder.calls)
        qualname = self._known(action)
        return [call for call in self.recorder.calls if call.action == qualname
                and (not isinstance(action, Step) or call.step.partition("[")[0] == action.name)]

    def _known(self, action: ActionName | Step | str) -> str:
        if isinstance(action, Step):
            action = action.action
        if not isinstance(action, (str, ActionName)):
            raise TypeError(f"an action (@agent.action or @agent.undo), its name or a Step, not {action!r}")
        qualname = action if isinstance(action, str) else action.qualname
        known = self.app.actions()
        if qualname not in known:
            raise KeyError(f"the app has no action {qualname!r}; it has {sorted(known) or 'none'}")
        return qualname

    def _on_error(self, message: Message, exc: BaseException) -> BaseException | None:
        """A task's end that is not an exception: a stubbed worker's death, done as an agent
        worker's main process does it; a stub run out, raised to the test."""
        if isinstance(exc, WorkerDied):
            if not report_lost(self.app.celery, message.kwargs, str(exc)):
                return AssertionError(f"could not report the lost worker of {message.task}")
            return None
        if isinstance(exc, _Exhausted):
            return exc.error
        return exc


def _test_settings(settings: Settings, home: Path, database_url: str, broker: str) -> Settings:
    """``settings`` on the environment's own store and broker (``broker``: its virtual host on the
    in-memory one), with nothing that reaches outside it (hooks, webhooks, faults, tracing, a
    breaker's Redis), and every step sent as a message of its own (no eager steps), so that a
    stubbed worker's death is reported for the step it ran, as it is for a step's own message."""
    overrides: Mapping[str, Any] = {
        "database_url": database_url, "broker_url": f"memory://localhost/{broker}", "home": home,
        "alert_hook": "", "alert_webhook": "", "faults": "", "tracing": "", "debug_logs": "", "breaker_url": "",
        "ready_file": "", "task_events": False, "retention": "", "eager_steps": 0,
    }
    return replace(settings, **overrides)
