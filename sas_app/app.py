"""The factory: one :class:`SasApp` holds a Celery app, a state store, the registered agents and
workflows, the Scheduler and the Supervisor. Build as many as you like in one process."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.signals import worker_process_init
from sqlalchemy import MetaData

from . import faults, operator, tracing
from .agent import Agent
from .alerts import Alerts, load_hook
from .client import RunHandle, RunView, get_run, submit
from .errors import WorkflowDefinitionError
from .migrate import migrate
from .scheduler import Scheduler
from .settings import Settings
from .store import Store
from .supervisor import Supervisor
from .workflow import Step, Workflow, check_workflow

log = logging.getLogger("sas")


class SasApp:
    """A Scheduler Agent Supervisor application.

    >>> sas = SasApp()                      # settings from SAS_* environment variables
    >>> payment = sas.agent("payment")      # one agent per remote service
    >>> @payment.action
    ... def charge(call): ...
    >>> sas.register(Workflow("order", [Step("charge", "payment.charge", timeout=10)]))
    >>> sas.submit("order", {"amount": 5}, business_key="order-1").wait()
    """

    def __init__(self, settings: Settings | None = None, *, main: str = "sas") -> None:
        from celeryconfig import celery_settings

        self.settings = settings or Settings.from_env()
        if self.settings.faults:
            faults.arm(self.settings.faults, self.settings.home)
        tracing.setup(self.settings.tracing)
        self.store = Store(self.settings.database_url)
        self.celery = Celery(main, set_as_current=False)
        self.celery.conf.update(celery_settings(self.settings))
        self.celery.sas = self
        self.alerts = Alerts(load_hook(self.settings.alert_hook), self.settings.alert_webhook,
                             self.settings.alert_webhook_timeout)
        self.agents: dict[str, Agent] = {}
        self.workflows: dict[str, Workflow] = {}
        self.tables: list[MetaData] = []
        self.scheduler = Scheduler(self.store, self.celery, self.settings, self.alerts)
        self.supervisor = Supervisor(self.store, self.celery, self.settings, self.alerts)
        worker_process_init.connect(self._after_fork, weak=True)

    def _after_fork(self, **_: Any) -> None:
        # A forked worker child must not share its parent's database connections.
        self.store.engine.dispose(close=False)

    # -- declaring ----------------------------------------------------------------------------

    def agent(self, name: str, **options: Any) -> Agent:
        """The agent for one remote service (created on first use); its queue is ``sas.agent.<name>``."""
        if name in self.agents:
            return self.agents[name]
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise WorkflowDefinitionError(f"agent name {name!r} must be letters, digits, '_' or '-'")
        s = self.settings
        redis_url = s.breaker_url or (s.broker_url if s.broker_url.startswith(("redis://", "rediss://")) else "")
        defaults: dict[str, Any] = {"breaker_fail_max": s.breaker_fail_max, "breaker_reset": s.breaker_reset,
                                    "breaker_url": redis_url or None,
                                    "scheduler": self.scheduler if s.inline_replies else None,
                                    "db_clock": self.store.db_clock if s.inline_replies else None,
                                    "rate_limit": s.rate_limit(name)}
        agent = Agent(self.celery, name, **{**defaults, **options})
        self.agents[name] = agent
        return agent

    def actions(self) -> set[str]:
        return {f"{a.name}.{action}" for a in self.agents.values() for action in a.actions}

    def register_tables(self, metadata: MetaData) -> None:
        """Your application's own tables (the orders, in the example): :meth:`migrate` creates
        them beside the state store's, so ``on_submit`` can write them in the submit transaction.
        Projects with their own migrations need not call this."""
        self.tables.append(metadata)

    def migrate(self) -> None:
        """Create or upgrade the state store's schema (Alembic), then any registered tables."""
        migrate(self.settings.database_url)
        for metadata in self.tables:
            metadata.create_all(self.store.engine)

    def register(self, workflow: Workflow) -> Workflow:
        """Check ``workflow`` against the registered agents and make it submittable."""
        if workflow.name in self.workflows:
            raise WorkflowDefinitionError(f"a workflow named {workflow.name!r} is already registered")
        check_workflow(workflow, self.actions(), visibility_timeout=self.settings.visibility_timeout)
        self.workflows[workflow.name] = workflow
        return workflow

    def workflow(self, name: str, steps: list[Step], **options: Any) -> Workflow:
        """Declare and register a workflow in one call."""
        return self.register(Workflow(name, steps, **options))

    # -- using --------------------------------------------------------------------------------

    def submit(
        self, workflow: str, payload: Any, *, business_key: str, reply_to: str | None = None, priority: int = 5
    ) -> RunHandle:
        """Start a run (see :func:`sas_app.client.submit`). ``priority`` 0-9: a more urgent run's
        steps overtake less urgent ones waiting on the same agent queue."""
        return submit(self, workflow, payload, business_key=business_key, reply_to=reply_to, priority=priority)

    def get_run(self, run_id: str) -> RunView:
        return get_run(self, run_id)

    # -- operating ----------------------------------------------------------------------------
    # Each is refused with InvalidOperation when the run's state does not allow it, and recorded
    # in the run's events with ``by`` and ``reason``.

    def resubmit(self, run_id: str, *, by: str, reason: str = "", step: str | None = None,
                 step_input: Any = None) -> None:
        operator.resubmit(self, run_id, by=by, reason=reason, step=step, step_input=step_input)

    def mark_done(self, run_id: str, step: str, *, by: str, reason: str = "", result: Any = None) -> None:
        operator.mark_done(self, run_id, step, by=by, reason=reason, result=result)

    def pause(self, run_id: str, *, by: str, reason: str = "") -> None:
        operator.pause(self, run_id, by=by, reason=reason)

    def resume(self, run_id: str, *, by: str, reason: str = "") -> None:
        operator.resume(self, run_id, by=by, reason=reason)

    def cancel(self, run_id: str, *, by: str, reason: str = "") -> str:
        return operator.cancel(self, run_id, by=by, reason=reason)

    def compensate(self, run_id: str, *, by: str, reason: str = "") -> None:
        operator.compensate(self, run_id, by=by, reason=reason)

    def handle(self, run_id: str) -> RunHandle:
        return RunHandle(self, run_id, created=False)

    def queues(self) -> list[str]:
        """Every queue this app's workers may consume."""
        return ["sas.scheduler", "sas.supervisor", *(a.queue for a in self.agents.values())]
