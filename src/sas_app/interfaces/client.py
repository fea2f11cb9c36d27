"""The client API other Python code uses: submit a run, look at it, wait for it."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError

from sas_app import fault_points, tracing
from sas_app.definitions.steps import StepDef
from sas_app.definitions.workflow import Workflow, workflow_name
from sas_app.engine.planner import Moves
from sas_app.engine.scheduler import Scheduler
from sas_app.errors import (
    DuplicateBusinessKey,
    InvalidSubmission,
    SasError,
    SchemaNotReady,
    UnknownRun,
    UnknownWorkflow,
)
from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import SUBMIT, Advance, Router, confirm_options
from sas_app.messaging.signing import BadSignature, Gate
from sas_app.settings import Settings
from sas_app.states import TERMINAL_RUN_STATES, RunState
from sas_app.store import EventRow, RunRow, StepRow, Store, Tx, stored_object
from sas_app.store.migrate import schema_problem

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)


def schema_not_ready(store: Store) -> None:
    """After a statement failed: :class:`SchemaNotReady` if the store's schema is why."""
    try:
        problem = schema_problem(store.engine)
    except Exception:  # the store is down: that, not the schema, is the problem
        return
    if problem:
        raise SchemaNotReady(problem) from None

MAX_KEY_LENGTH = 200
#: most seconds wait() goes without reading the run, a notice of its end or not
RECHECK = 1.0


@dataclass(frozen=True)
class RunView:
    """A run as the store holds it now, with its steps and history."""

    run: RunRow
    steps: list[StepRow]
    events: list[EventRow]

    @property
    def id(self) -> str:
        return self.run.id

    @property
    def state(self) -> RunState:
        """The run's state now (``view.state is RunState.PROCESSED``)."""
        return RunState(self.run.process_state)

    @property
    def process_state(self) -> str:
        """The run's state as the store holds it: the pattern's ProcessState (see :attr:`state`)."""
        return self.run.process_state

    @property
    def terminal(self) -> bool:
        return self.run.process_state in TERMINAL_RUN_STATES

    def step(self, step: StepDef | str) -> StepRow:
        """The run's step, by its definition or its name."""
        name = step if isinstance(step, str) else step.name
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"run {self.id} has no step {name!r}")


class RunHandle:
    """What :func:`submit` returns: the run's id, whether this call created it, and ways to watch it."""

    def __init__(self, client: Client, run_id: str, created: bool) -> None:
        self.client = client
        self.id = run_id
        self.created = created

    def __repr__(self) -> str:
        return f"<RunHandle {self.id} created={self.created}>"

    def status(self) -> RunView:
        return self.client.get_run(self.id)

    def wait(self, timeout: float = 60.0) -> RunView:
        """Block until the run is terminal (processed, error, compensated, cancelled) and return it.

        On PostgreSQL this sleeps until the database announces that the run finished (LISTEN /
        NOTIFY, sent when the final transition commits), reading the run only then; on the
        embedded SQLite store it polls with a growing interval. Either way it reads the run at
        least once a second, so a lost notice costs at most that. Raises ``TimeoutError`` naming
        the state the run was left in."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        store = self.client.store
        with store.listen_for_finished_runs() as listen:
            while True:
                run = store.get_run(self.id)
                if run is not None and run.process_state in TERMINAL_RUN_STATES:
                    return self.status()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    state = run.process_state if run else "missing"
                    raise TimeoutError(f"run {self.id} is still {state} after {timeout}s")
                if listen is None:
                    time.sleep(min(delay, remaining))
                    delay = min(delay * 1.5, 0.5)
                    continue
                # the run is read again at least every RECHECK seconds: behind a pooler in transaction
                # mode (PgBouncer) the LISTEN's session is not this client's, and no notice comes
                recheck = min(deadline, time.monotonic() + RECHECK)
                while self.id not in listen(recheck - time.monotonic()) and time.monotonic() < recheck:
                    pass


class Client:
    """Submitting runs and looking at them: what :class:`SasApp` offers other Python code.

    Built from the store, the settings, the router and the registered workflows; with a
    ``scheduler`` (SAS_INLINE_REPLIES, the default) a new run's first move is made in this process.
    With ``celery``, it also takes submissions sent as the Celery task ``sas.submit`` by producers
    that have only the broker (:class:`sas_app.Producer`, or any Celery app's ``send_task``)."""

    def __init__(self, store: Store, settings: Settings, router: Router, workflows: Mapping[str, Workflow],
                 scheduler: Scheduler | None = None, celery: Celery | None = None, gate: Gate | None = None) -> None:
        self.store = store
        self.settings = settings
        self.router = router
        self.workflows = workflows
        self.scheduler = scheduler
        #: who may submit through the broker (SAS_BROKER_TRUST)
        self.gate = gate or Gate("open", "", settings.broker_signature_max_age)
        if celery is not None:
            self._register_submit_task(celery)

    def _register_submit_task(self, celery: Celery) -> None:
        @celery.task(name=SUBMIT, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True,
                     ignore_result=True, max_retries=None)
        def submit(task: Any, workflow: Any = None, payload: Any = None, business_key: Any = None,
                   reply_to: Any = None, priority: Any = 5, sas_signature: Any = None) -> dict[str, Any]:
            """The same rules as :meth:`submit`, after the broker's trust (:class:`Gate`); a refusal
            is logged and answered on ``reply_to`` (nothing written); a message delivered twice
            makes one run (its business key)."""
            kwargs = dict(task.request.kwargs or {})  # as sent: what the signature covers
            try:
                verified = self.gate.admit(SUBMIT, kwargs, task.request.args or ())
            except BadSignature as exc:
                log.error("submission of %r (business key %r) from the broker refused: %s", workflow, business_key,
                          exc)
                if exc.authentic:  # a producer of ours, told why (an unverified sender is told nothing)
                    self._refused(reply_to, workflow, business_key, str(exc))
                return {"refused": str(exc)}
            try:
                handle = self.submit(workflow, payload, business_key=business_key, reply_to=reply_to,
                                     priority=priority)
            except SchemaNotReady as exc:  # not the submission's fault: it is taken once migrated
                raise task.retry(exc=exc, countdown=min(2.0 ** task.request.retries, 30.0),
                                 kwargs=self.gate.resigned(SUBMIT, kwargs, verified),
                                 **confirm_options(task.app)) from None
            except SasError as exc:
                log.error("submission of %r (business key %r) refused: %s", workflow, business_key, exc)
                self._refused(reply_to, workflow, business_key, str(exc))
                return {"refused": str(exc)}
            except Exception as exc:  # the store is down: the submission must not be lost
                raise task.retry(exc=exc, countdown=min(2.0 ** task.request.retries, 30.0),
                                 kwargs=self.gate.resigned(SUBMIT, kwargs, verified),
                                 **confirm_options(task.app)) from None
            return {"run_id": handle.id, "created": handle.created}

    def _refused(self, reply_to: Any, workflow: Any, business_key: Any, reason: str) -> None:
        """Tell ``reply_to`` (if it names a queue) that a submission from the broker was refused."""
        if isinstance(reply_to, str) and 0 < len(reply_to) <= 200:
            self.router.answer(reply_to, {"id": f"refused:{workflow}:{business_key}", "kind": "refused",
                                          "workflow": workflow, "business_key": business_key, "run_id": None,
                                          "reason": reason})

    def handle(self, run_id: str) -> RunHandle:
        return RunHandle(self, run_id, created=False)

    def get_run(self, run_id: str) -> RunView:
        run = self.store.get_run(run_id)
        if run is None:
            raise UnknownRun(f"no run with id {run_id!r}")
        return RunView(run, self.store.get_steps(run_id), self.store.get_events(run_id))

    def submit(self, workflow: Workflow | str, payload: Any, *, business_key: str, reply_to: str | None = None,
               priority: int = 5) -> RunHandle:
        """Write the run, its steps and whatever the workflow's ``on_submit`` writes in one
        transaction, then ask the Scheduler to start it.

        With a scheduler (SAS_INLINE_REPLIES, the default) the same transaction claims the run and
        marks its first step running, and the calling process dispatches it, as the Scheduler
        would; otherwise it sends ``sas.scheduler.advance``. The same business key submitted
        again returns the existing run (``handle.created`` is False); with a different payload it
        raises :class:`DuplicateBusinessKey`. Bad input raises :class:`InvalidSubmission` or
        :class:`UnknownWorkflow` and writes nothing.
        """
        wf, payload = self.checked(workflow, payload, business_key, reply_to, priority)
        run_id = uuid.uuid4().hex
        with tracing.span("sas.submit", workflow=wf.name, business_key=business_key, run_id=run_id):
            return self._submit(wf, run_id, payload, business_key, reply_to, priority)

    def checked(self, workflow: Any, payload: Any, business_key: Any, reply_to: Any,
                priority: Any) -> tuple[Workflow, Any]:
        """The workflow and the payload as the store will hold it; :class:`UnknownWorkflow` or
        :class:`InvalidSubmission` naming the first problem."""
        wf = self.workflows.get(workflow_name(workflow)) if isinstance(workflow, (Workflow, str)) else None
        if wf is None:
            raise UnknownWorkflow(f"unknown workflow {workflow!r}; registered: {sorted(self.workflows) or 'none'}")
        try:
            payload = wf.stored_input(payload)  # validated against its input model, if it has one
        except ValueError as exc:
            raise InvalidSubmission(str(exc)) from None
        payload = self._check(payload, business_key, reply_to, priority)
        try:
            wf.slot_of(payload)
        except ValueError as exc:
            raise InvalidSubmission(str(exc)) from None
        return wf, payload

    def _check(self, payload: Any, business_key: Any, reply_to: Any, priority: Any) -> Any:
        """The payload as the store will hold it; :class:`InvalidSubmission` naming the first problem."""
        if not isinstance(business_key, str) or not business_key.strip():
            raise InvalidSubmission(f"business_key must be a non-empty string, got {business_key!r}")
        if len(business_key) > MAX_KEY_LENGTH or not business_key.isprintable():
            raise InvalidSubmission(f"business_key must be printable and at most {MAX_KEY_LENGTH} characters")
        if reply_to is not None and (not isinstance(reply_to, str) or not reply_to or len(reply_to) > 200):
            raise InvalidSubmission(f"reply_to must be a queue name, got {reply_to!r}")
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
            raise InvalidSubmission(f"priority must be an integer from 0 (least urgent) to 9, got {priority!r}")
        try:
            return stored_object(payload, self.settings.max_payload_bytes)
        except ValueError as exc:
            raise InvalidSubmission(str(exc)) from None

    def _submit(self, wf: Workflow, run_id: str, payload: Any, business_key: str, reply_to: str | None,
                priority: int) -> RunHandle:
        new = wf.new_run(run_id, business_key, payload, reply_to=reply_to, priority=priority)
        moves = Moves()
        try:
            started = self.scheduler.submitted(new) if self.scheduler and wf.on_submit is None else None
            if started is not None:  # written already started, in one statement
                run, created, tx, moves = started
            else:
                with self.store.begin() as tx:
                    run, created = tx.submission.insert_run(new, self.settings.pickup_timeout)
                    if created:
                        if wf.on_submit is not None:
                            wf.on_submit(tx.conn, run)
                        moves = self.first_move(tx, run.id)
        except DBAPIError:
            schema_not_ready(self.store)
            raise
        if not created:
            if run.payload != payload:
                raise DuplicateBusinessKey(
                    f"business key {business_key!r} already names run {run.id} of workflow "
                    f"{wf.name!r} with a different payload"
                )
            return RunHandle(self, run.id, created=False)
        fault_points.hit("submit.after_commit")
        self.start(tx, run.id, moves)
        return RunHandle(self, run.id, created=True)

    def first_move(self, tx: Tx, run_id: str) -> Moves:
        """Inside the transaction that writes a new run: with a scheduler (SAS_INLINE_REPLIES), its
        first move made here (claim it, mark its first step running: one message, one hop and one
        commit fewer per run); without, nothing yet."""
        return Moves() if self.scheduler is None else self.scheduler.moves(tx, run_id)

    def start(self, tx: Tx, run_id: str, moves: Moves) -> None:
        """Once that transaction has committed: send what its first move decided, or else the
        Scheduler's message (were it lost, the Supervisor asks again after SAS_PICKUP_TIMEOUT)."""
        if self.scheduler is not None:
            self.scheduler.after_commit(tx, moves)
        else:
            self.router.relay(tx.outbox)
            self.router.send(Advance(run_id, Publish.SUBMITTED))
