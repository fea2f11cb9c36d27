"""The factory: one :class:`SasApp` holds a Celery app, a state store, the registered agents and
workflows, and wires the actors together — the router every message goes through, the Scheduler,
the Supervisor, the client and the operators. Build as many as you like in one process."""

from __future__ import annotations

import gc
import importlib
import inspect
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, overload

from celery import Celery
from celery.signals import (
    beat_init,
    celeryd_after_setup,
    worker_before_create_process,
    worker_init,
    worker_process_init,
    worker_ready,
    worker_shutting_down,
)
from pydantic import BaseModel
from sqlalchemy import MetaData
from sqlalchemy.exc import SQLAlchemyError

from sas_app import fault_points, tracing
from sas_app.agents import handover
from sas_app.agents.agent import Agent
from sas_app.agents.breaker import STORE_FRESH, RedisState
from sas_app.agents.rate_limit import RedisSlots as RateSlots
from sas_app.definitions.actions import AgentCall, UndoAction
from sas_app.definitions.checks import check_workflow
from sas_app.definitions.steps import StepDef, WaitFor
from sas_app.definitions.workflow import OnSubmit, Workflow, workflow_name
from sas_app.engine.alerts import Alerts, load_hook
from sas_app.engine.scheduler import Scheduler
from sas_app.errors import InvalidSignal, WorkflowDefinitionError
from sas_app.interfaces.access import Tokens
from sas_app.interfaces.audit import AuditTrail
from sas_app.interfaces.bulk import Submission, Submitted, submit_many
from sas_app.interfaces.client import Client, RunHandle, RunView
from sas_app.interfaces.doctor import Doctor
from sas_app.interfaces.operations import Operator
from sas_app.interfaces.reruns import Reruns
from sas_app.interfaces.retention import Retention, parse_duration
from sas_app.interfaces.schedules import Overlap, Schedule, Schedules
from sas_app.interfaces.signals import SignalReceipt, Signals
from sas_app.messaging.celery_config import celery_settings, with_own
from sas_app.messaging.routing import SCHEDULER_QUEUE, SUPERVISOR_QUEUE, SWEEP, Router, confirm_options
from sas_app.messaging.signing import Gate
from sas_app.settings import Settings, redact_url
from sas_app.states import RunState
from sas_app.store import Store
from sas_app.store.connection import Clock
from sas_app.store.migrate import ensure_schema, migrate, schema_lock, schema_problem
from sas_app.supervision.supervisor import Supervisor

log = logging.getLogger(__name__)


class SasApp:
    """A Scheduler Agent Supervisor application.

    >>> sas = SasApp()                      # settings from SAS_* environment variables
    >>> payment = sas.agent("payment")      # one agent per remote service
    >>> @payment.action
    ... def charge(call): ...
    >>> sas.register(Workflow("order", [Step("charge", "payment.charge", timeout=10)]))
    >>> sas.submit("order", {"amount": 5}, business_key="order-1").wait()

    ``celery_config`` names a module of your own Celery settings (``celeryconfig``, by Celery's
    convention) applied over sas_app's; ``clock`` replaces an SQLite store's clock and the one
    its agents measure a step's time left on, and its ``sleep``, if it has one, is what their
    in-process retries wait with (tests: :class:`sas_app.testing.VirtualClock`).
    """

    def __init__(self, settings: Settings | None = None, *, main: str = "sas", celery_config: str | None = None,
                 clock: Clock | None = None) -> None:
        self.settings = settings or Settings.from_env()
        if self.settings.embedded_store:  # no server, no `sas migrate` to remember
            ensure_schema(self.settings.database_url, Path(self.settings.home))
        if self.settings.faults:
            fault_points.arm(self.settings.faults, self.settings.home)
        tracing.setup(self.settings.tracing)
        for name in filter(None, (n.strip() for n in self.settings.debug_logs.split(","))):
            logging.getLogger(name).setLevel(logging.DEBUG)
        self.store = Store(self.settings.database_url, clock, prepared=self.settings.prepared_statements)
        self._clock = clock
        self.celery = Celery(main, set_as_current=False)
        conf = celery_settings(self.settings)
        self.celery.conf.update(with_own(conf, _own_settings(celery_config)) if celery_config else conf)
        # beat's publishes wait for the broker's confirm no longer than the router's do
        self.celery.conf.beat_schedule[SWEEP]["options"].update(confirm_options(self.celery))
        self.celery.sas = self
        self.alerts = Alerts(load_hook(self.settings.alert_hook), self.settings.alert_webhook,
                             self.settings.alert_webhook_timeout)
        self.agents: dict[str, Agent] = {}
        #: the options each agent was declared with (what a test environment declares again)
        self.agent_options: dict[str, dict[str, Any]] = {}
        self.workflows: dict[str, Workflow] = {}
        self.tables: list[MetaData] = []
        self.router = Router(self.celery, self.settings, self.store.mark_sent)
        self.scheduler = Scheduler(self.store, self.celery, self.settings, self.alerts, self.router, self.has_action,
                                   self.workflows)
        self.supervisor = Supervisor(self.store, self.celery, self.settings, self.alerts, self.router,
                                     clock or time.monotonic)
        inline = self.scheduler if self.settings.inline_replies else None
        self.gate = Gate(self.settings.broker_trust, self.settings.broker_keys, self.settings.broker_signature_max_age)
        if self.gate.keys and self.settings.retention and \
                parse_duration(self.settings.retention) <= self.settings.broker_signature_max_age:
            raise ValueError("SAS_BROKER_SIGNATURE_MAX_AGE must be shorter than SAS_RETENTION: a signed submission "
                             "replayed after its run was deleted would start it again")
        self.client = Client(self.store, self.settings, self.router, self.workflows, inline, self.celery, self.gate)
        self.operator = Operator(self.store, self.settings, self.router, self.workflows)
        self.reruns = Reruns(self.client)
        self.signals = Signals(self.store, self.settings, self.scheduler, self.celery, self.gate)
        self.tokens = Tokens(self.store)
        self.audit = AuditTrail(self.store)
        self.gate.on_refusal = self.audit.broker_refusal
        self.schedules = Schedules(self.store, self.settings, self.router, self.workflows, self.celery)
        self.retention = Retention(self.store, self.settings, self.celery)
        self.doctor = Doctor(self.store, self.celery, self.settings, lambda: [a.queue for a in self.agents.values()])
        self._frozen = False
        worker_init.connect(self._worker_init, weak=True)
        worker_before_create_process.connect(self._before_first_fork, weak=True)
        worker_process_init.connect(self._after_fork, weak=True)
        worker_ready.connect(self._worker_ready, weak=True)
        worker_shutting_down.connect(self._worker_shutting_down, weak=True)
        celeryd_after_setup.connect(self._check_schema, weak=True)
        beat_init.connect(self._ready, weak=True)

    def _worker_init(self, sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is self.celery:
            handover.watch_for_drain()  # before the pool's processes are forked: they share it

    def _before_first_fork(self, **_: Any) -> None:
        """Before a prefork pool forks its first process: what is loaded by now (Celery, the app,
        its workflows) lives as long as the worker. Frozen, the garbage collector never walks it
        again — neither in the collection Celery makes before forking each pool process nor in the
        worker's later full ones — and the forked processes do not copy the memory pages those walks
        would write to. Once only: a pool process replaced later would freeze the garbage of the
        worker's work since, for good."""
        if not self._frozen:
            self._frozen = True
            gc.freeze()

    def _after_fork(self, **_: Any) -> None:
        # A forked worker child must not share its parent's database connections.
        self.store.engine.dispose(close=False)

    def _check_schema(self, sender: Any = None, instance: Any = None, **_: Any) -> None:
        """A worker of this app that uses the state store does not start on a schema that is
        missing or older than this sas_app needs: one clear line naming ``sas migrate``, not a
        traceback in every task. A store it cannot reach yet is left to the tasks' own retries."""
        if getattr(instance, "app", None) is not self.celery:
            return
        consumed = set(instance.app.amqp.queues.consume_from or ())
        if not self.settings.inline_replies and not consumed & {SCHEDULER_QUEUE, SUPERVISOR_QUEUE}:
            return
        try:
            problem = schema_problem(self.store.engine)
        except SQLAlchemyError as exc:
            log.warning("could not check the state store's schema (%s); starting anyway", str(exc).splitlines()[0])
            return
        if problem:
            log.critical("%s (%s)", problem, redact_url(self.settings.database_url))
            print(f"sas worker: {problem}", file=sys.stderr, flush=True)
            raise SystemExit(1)  # Celery stops the worker with this exit code

    def _ready(self, sender: Any = None, **_: Any) -> None:
        """A worker (or beat) of this app is consuming: say so in SAS_READY_FILE, if set."""
        if self.settings.ready_file and getattr(sender, "app", None) is self.celery:
            Path(self.settings.ready_file).write_text("ready\n")

    def _worker_ready(self, sender: Any = None, **_: Any) -> None:
        """A worker of this app is consuming; one that consumes the Supervisor's queue looks at the
        agents' queues from now on (:mod:`sas_app.supervision.forecast.lookout`), and sweeps once
        at once rather than a beat interval later: a Supervisor back from a restart recovers what
        is due straight away, and ``sas doctor`` sees it sweeping as soon as it is up."""
        if getattr(sender, "app", None) is not self.celery:
            return
        if SUPERVISOR_QUEUE in sender.app.amqp.queues.consume_from:
            self.supervisor.forecast.start()
            try:  # as beat sends it: its queue, expiry and confirm time-out
                sender.app.send_task(SWEEP, **sender.app.conf.beat_schedule[SWEEP]["options"])
            except Exception as exc:  # beat's next sweep does the same: never keep the worker from starting
                log.warning("the first sweep was not sent (%s); beat's next one will do", exc)
        self._ready(sender)

    def _worker_shutting_down(self, **_: Any) -> None:
        self.supervisor.forecast.stop()
        handover.drain()

    # -- declaring ----------------------------------------------------------------------------

    def agent(self, name: str, *, retry_initial: float | None = None, retry_max: float | None = None,
              retry_jitter: bool | None = None, breaker_fail_max: int | None = None,
              breaker_reset: float | None = None, rate_limit: str | None = None,
              rate_limit_key: Callable[[AgentCall], object] | None = None,
              db_clock: Callable[[], float | None] | None = None, sleep: Callable[[float], None] | None = None,
              ) -> Agent:
        """The agent for one remote service (created on first use); its queue is ``sas.agent.<name>``.

        Its transient faults are retried in process from ``retry_initial`` seconds, doubling up to
        ``retry_max``, each wait with up to ``retry_initial`` more at random unless ``retry_jitter``
        is False; ``breaker_fail_max`` attempts in a row failing open its circuit breaker for
        ``breaker_reset`` seconds (0 turns it off; default ``SAS_BREAKER_FAIL_MAX``,
        ``SAS_BREAKER_RESET``); ``rate_limit`` (``"20/s"``, default from
        ``SAS_AGENT_RATE_LIMITS``) caps the calls of every worker together, per
        ``rate_limit_key(call)`` if given. ``db_clock`` and ``sleep`` replace the store's clock and
        the retries' wait (tests). Left out (None), each takes its default."""
        if name in self.agents:
            return self.agents[name]
        given = {"retry_initial": retry_initial, "retry_max": retry_max, "retry_jitter": retry_jitter,
                 "breaker_fail_max": breaker_fail_max,
                 "breaker_reset": breaker_reset, "rate_limit": rate_limit, "rate_limit_key": rate_limit_key,
                 "db_clock": db_clock, "sleep": sleep}
        options = {key: value for key, value in given.items() if value is not None}
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise WorkflowDefinitionError(f"agent name {name!r} must be letters, digits, '_' or '-'")
        s = self.settings
        redis_url, tls = s.breaker_redis_url, s.redis_tls(s.breaker_redis_url)
        defaults: dict[str, Any] = {"breaker_fail_max": s.breaker_fail_max, "breaker_reset": s.breaker_reset,
                                    "breaker_state": (lambda: RedisState(redis_url, **tls)) if redis_url else
                                    self.store.breaker_state,
                                    "breaker_fresh": 0.0 if redis_url else STORE_FRESH,
                                    "replies": self.scheduler if s.inline_replies else None,
                                    "db_clock": self.store.db_clock if s.inline_replies else None,
                                    "clock": self._clock or time.monotonic,
                                    "sleep": getattr(self._clock, "sleep", time.sleep),
                                    "rate_limit": s.rate_limit(name),
                                    "rate_slots": (lambda: RateSlots(redis_url, **tls)) if redis_url else
                                    self.store.rate_slots,
                                    "queue_wait_max": s.queue_wait_max,
                                    "eager_steps": s.eager_steps,
                                    "inputs": self._input_of}
        agent = Agent(self.celery, name, **{**defaults, **options})
        self.agents[name] = agent
        self.agent_options[name] = dict(options)
        return agent

    def _input_of(self, workflow: str, payload: Any) -> Any:
        """A stored payload as an action of ``workflow`` gets it: its input model, if it has one."""
        found = self.workflows.get(workflow)
        return payload if found is None else found.parsed_input(payload)

    def has_action(self, agent: str, action: str) -> bool | None:
        """Whether this process's code has ``agent.action``; None if it declares no agents at all
        (a process that only submits cannot tell)."""
        if not self.agents:
            return None
        found = self.agents.get(agent)
        return found is not None and action in found.actions

    def actions(self) -> set[str]:
        """Every registered action and undo, as ``<agent>.<name>``."""
        return {f"{a.name}.{action}" for a in self.agents.values() for action in a.actions}

    def undos(self) -> set[str]:
        """The registered undos (``@agent.undo``), as ``<agent>.<name>``."""
        return {undo.qualname for a in self.agents.values() for undo in a.actions.values()
                if isinstance(undo, UndoAction)}

    def register_tables(self, metadata: MetaData) -> None:
        """Your application's own tables (the orders, in the example): :meth:`migrate` creates
        them beside the state store's, so ``on_submit`` can write them in the submit transaction.
        Projects with their own migrations need not call this. On the embedded default they are
        created at once."""
        self.tables.append(metadata)
        if self.settings.embedded_store:
            with schema_lock(Path(self.settings.home)):
                metadata.create_all(self.store.engine)

    def migrate(self) -> None:
        """Create or upgrade the state store's schema (Alembic), then any registered tables."""
        migrate(self.settings.database_url)
        for metadata in self.tables:
            metadata.create_all(self.store.engine)

    def register(self, workflow: Workflow) -> Workflow:
        """Check ``workflow`` against the registered agents and make it submittable."""
        if workflow.name in self.workflows:
            raise WorkflowDefinitionError(f"a workflow named {workflow.name!r} is already registered")
        s = self.settings
        check_workflow(workflow, self.actions(), undos=self.undos(), visibility_timeout=s.visibility_timeout,
                       consumer_timeout=s.broker_consumer_timeout if s.amqp_broker else None,
                       clock_skew=s.clock_skew, known_workflows=self.workflows, max_sleep=s.max_sleep,
                       max_deadline=s.max_deadline)
        self.workflows[workflow.name] = workflow
        return workflow

    def workflow(self, name: str, steps: Sequence[StepDef], *, on_submit: OnSubmit | None = None,
                 description: str = "", version: str | None = None, deadline: float | timedelta | None = None,
                 concurrency_key: str | None = None, max_running: int = 1, input: type[BaseModel] | None = None,
                 ) -> Workflow:
        """Declare and register a workflow in one call (the options are :class:`Workflow`'s)."""
        return self.register(Workflow(name, steps, on_submit=on_submit, description=description, version=version,
                                      deadline=deadline, concurrency_key=concurrency_key, max_running=max_running,
                                      input=input))

    def schedule(self, name: str, *, cron: str, payload: Any = None, workflow: Workflow | str | None = None,
                 overlap: Overlap | Literal["skip", "allow", "cancel_previous"] = Overlap.SKIP,
                 catch_up: float | timedelta = timedelta(hours=1)) -> Schedule:
        """Start a run of ``workflow`` (default: the workflow named ``name``) at every tick of
        ``cron``, through Celery beat — exactly one per tick, whatever the number of beats; ticks
        missed within ``catch_up`` start once each; ``overlap``: ``skip``, ``allow`` or
        ``cancel_previous`` while the schedule's previous run is live (see :mod:`sas_app.interfaces.schedules`)."""
        return self.schedules.add(name, cron=cron, payload=payload, workflow=workflow, overlap=overlap,
                                  catch_up=catch_up)

    # -- using (sas_app.interfaces.client) ---------------------------------------------------

    def submit(self, workflow: Workflow | str, payload: Any, *, business_key: str, reply_to: str | None = None,
               priority: int = 5) -> RunHandle:
        """Start a run of ``workflow`` (a registered Workflow, or its name; see :meth:`Client.submit`).
        ``priority`` 0-9: a more urgent run's steps overtake less urgent ones waiting on the same
        agent queue."""
        return self.client.submit(workflow, payload, business_key=business_key, reply_to=reply_to, priority=priority)

    def submit_many(self, items: Iterable[Submission | Mapping[str, Any]]) -> list[Submitted]:
        """Submit many runs in one transaction (see :mod:`sas_app.interfaces.bulk`): each item a
        :class:`Submission` or a mapping of its fields; one :class:`Submitted` per item, in order —
        its run's handle, or the error that kept it out (nothing of it written). Each new run is
        started by the Scheduler's message."""
        return submit_many(self.client, items)

    @overload
    def signal(self, run_id: str, event: WaitFor | str, payload: Any = None, *, by: str = "") -> SignalReceipt: ...

    @overload
    def signal(self, *, workflow: str | Workflow, business_key: str, event: WaitFor | str, payload: Any = None,
               by: str = "") -> SignalReceipt: ...

    def signal(self, run_id: str | None = None, event: WaitFor | str | None = None, payload: Any = None, *,
               workflow: str | Workflow | None = None, business_key: str | None = None,
               by: str = "") -> SignalReceipt:
        """Send ``event`` to a run waiting for it (:class:`WaitFor`), named by its id —
        ``sas.signal(run_id, approval, {...})`` — or by its workflow and business key —
        ``sas.signal(workflow=claims, business_key="claim-42", event=approval, payload={...})``;
        ``event`` is the ``WaitFor`` step or the name of the event it waits for, and ``payload``
        (a JSON object) becomes the wait's result. A signal that comes before the run reaches its
        wait is kept until it does (see :class:`SignalReceipt`)."""
        if event is None:
            raise InvalidSignal("name the event to send: signal(run_id, event, ...) or signal(..., event=...)")
        if isinstance(event, WaitFor):
            event = event.event
        if (run_id is None) == (workflow is None and business_key is None):
            raise InvalidSignal("name the run by its id, or by workflow= and business_key=, not both")
        if run_id is not None:
            return self.signals.send(run_id, event, payload, by=by)
        if workflow is None or business_key is None:
            raise InvalidSignal("a run named by its workflow needs both workflow= and business_key=")
        return self.signals.send((workflow_name(workflow), business_key), event, payload, by=by)

    def get_run(self, run_id: str) -> RunView:
        return self.client.get_run(run_id)

    def handle(self, run_id: str) -> RunHandle:
        return self.client.handle(run_id)

    # -- operating (sas_app.interfaces.operations) ------------------------------------------
    # Each is refused with InvalidOperation when the run's state does not allow it, and recorded
    # in the run's events with ``by`` and ``reason``.

    def resubmit(self, run_id: str, *, by: str, reason: str = "", step: StepDef | str | None = None,
                 step_input: Any = None) -> None:
        """Put a run in ``error`` back to work from its failed step (``step``, a step object or its
        name, when it failed in several), optionally with an edited input (``step_input``)."""
        self.operator.resubmit(run_id, by=by, reason=reason, step=None if step is None else _step_name(step),
                               step_input=step_input)

    def mark_done(self, run_id: str, step: StepDef | str, *, by: str, reason: str = "", result: Any = None) -> None:
        """Record ``step`` (a step object or its name) as completed by hand, with ``result``; the
        run goes on with the next one."""
        self.operator.mark_done(run_id, _step_name(step), by=by, reason=reason, result=result)

    def pause(self, run_id: str, *, by: str, reason: str = "") -> None:
        self.operator.pause(run_id, by=by, reason=reason)

    def resume(self, run_id: str, *, by: str, reason: str = "") -> None:
        self.operator.resume(run_id, by=by, reason=reason)

    def cancel(self, run_id: str, *, by: str, reason: str = "") -> RunState:
        """Stop a pending or processing run and undo what it did: the state it is in now,
        ``compensating`` while its undos run, else ``cancelled``."""
        return RunState(self.operator.cancel(run_id, by=by, reason=reason))

    def compensate(self, run_id: str, *, by: str, reason: str = "") -> None:
        self.operator.compensate(run_id, by=by, reason=reason)

    def rerun(self, run_id: str, from_step: StepDef | str, *, by: str, reason: str = "") -> RunHandle:
        """Start ``run_id`` again on the workflow deployed now, from ``from_step`` (a step object
        or its name): the steps it waits for keep the old run's results, the rest run again
        (see :mod:`sas_app.interfaces.reruns`). The old run keeps its history; the two are linked."""
        return self.reruns.rerun(run_id, _step_name(from_step), by=by, reason=reason)

    def queues(self) -> list[str]:
        """Every queue this app's workers may consume."""
        return [SCHEDULER_QUEUE, SUPERVISOR_QUEUE, *(a.queue for a in self.agents.values())]


def _step_name(step: StepDef | str) -> str:
    """A step's name, given the step or its name."""
    return step if isinstance(step, str) else step.name


def _own_settings(module_name: str) -> dict[str, Any]:
    """The lowercase settings of a Celery config module; none if there is no such module."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        return {}
    return {key: value for key, value in vars(module).items()
            if key.islower() and not key.startswith("_") and not key == "annotations"
            and not (inspect.ismodule(value) or inspect.isclass(value) or inspect.isroutine(value))}
