"""The Agent: wraps one remote service; one Celery queue per agent (``sas.agent.<name>``).

An action is a function ``fn(call: AgentCall) -> JSON``, plain or ``async def`` (run on the worker
thread's event loop, cancelled at complete-by: :mod:`sas_app.agents.coroutines`). The base around it retries
transient faults with exponential back-off while the step's complete-by allows, passes the same
idempotency key and the attempt's fencing token on every try, stops silently once complete-by has
passed, and replies to the Scheduler with the result, a non-transient error, or — from a polling
step — "not yet" (:class:`~sas_app.errors.NotYet`).

Replies go to a :class:`Replies` the application wires in: the Scheduler's handlers run in this
process (one message per step), or, failing that or with ``SAS_INLINE_REPLIES`` off, a message on
the Scheduler's queue. The agent knows nothing else of the Scheduler.
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
import time
from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, cast, overload

from celery.exceptions import Reject, SoftTimeLimitExceeded
from sqlalchemy.exc import DBAPIError, OperationalError
from tenacity import Retrying, retry_if_exception, stop_before_delay, wait_exponential, wait_random

from sas_app import fault_points, tracing
from sas_app.agents.breaker import Breaker, BreakerOpen, LocalState, SharedState
from sas_app.agents.coroutines import run_bounded
from sas_app.agents.handover import Handover
from sas_app.agents.rate_limit import LocalSlots, RateLimit, RateLimited, Slots
from sas_app.agents.worker_lost import AgentRequest
from sas_app.definitions.actions import AgentAction, AgentCall, R, UndoAction, UndoCall
from sas_app.errors import (
    NotYet,
    PermanentError,
    StaleAttempt,
    StepExpired,
    TransientError,
    WorkflowDefinitionError,
)
from sas_app.messaging.fault_log import FaultLog, describe
from sas_app.messaging.publishes import Publish, headers
from sas_app.messaging.routing import (
    SCHEDULER_QUEUE,
    STEP_DEFERRED,
    STEP_DONE,
    STEP_FAILED,
    STEP_FAULTS,
    STEP_NOT_YET,
    AgentMessage,
    agent_queue,
    agent_task_name,
    confirm_options,
    keeping,
)

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)

#: seconds an agent waits before handing a late message back to its queue while the store cannot be
#: asked about it (so that its workers do not spin on it)
STORE_DOWN_PAUSE = 1.0


class ActionDecorator(Protocol):
    """What ``@agent.action(name=...)`` returns: applied to a function, as ``@agent.action`` alone."""

    @overload
    def __call__(self, fn: Callable[[AgentCall], Coroutine[Any, Any, R]], /) -> AgentAction[R]: ...

    @overload
    def __call__(self, fn: Callable[[AgentCall], R], /) -> AgentAction[R]: ...


class UndoDecorator(Protocol):
    """What ``@agent.undo(name=...)`` returns: applied to a function, as ``@agent.undo`` alone."""

    @overload
    def __call__(self, fn: Callable[[UndoCall], Coroutine[Any, Any, R]], /) -> UndoAction[R]: ...

    @overload
    def __call__(self, fn: Callable[[UndoCall], R], /) -> UndoAction[R]: ...


class Replies(Protocol):
    """Where an agent's replies go when they are handled in its own process: the Scheduler's
    handlers, with the same names and arguments as its tasks. Any exception sends the reply to the
    Scheduler's queue instead."""

    def step_done(self, run_id: str, position: int, attempt: int, result: Any = None,
                  results: dict[str, Any] | None = None, faults: dict[str, Any] | None = None,
                  workflow: str | None = None, *, notify: bool = True) -> None: ...

    def step_failed(self, run_id: str, position: int, attempt: int, error: str,
                    faults: dict[str, Any] | None = None) -> None: ...

    def step_deferred(self, run_id: str, position: int, attempt: int, delay: float, reason: str,
                      faults: dict[str, Any] | None = None) -> None: ...

    def step_not_yet(self, run_id: str, position: int, attempt: int, after: float | None = None, detail: str = "",
                     faults: dict[str, Any] | None = None) -> None: ...

    def step_faults(self, run_id: str, position: int, attempt: int, faults: dict[str, Any] | None = None,
                    gave_up: bool = False) -> None: ...

    def start_late(self, run_id: str, position: int, attempt: int) -> float | None:
        """A message taken late (it waited in the queue): when its attempt now ends (the
        database's clock, a whole timeout from now) if the store still wants that attempt, or None."""

    def still_running(self, run_id: str, position: int, attempt: int) -> bool:
        """Whether the store still waits for this attempt: a message delivered a second time."""

    def resend(self, message: AgentMessage) -> bool:
        """Publish a step's message to its agent's queue: a step this process took over from a
        reply and cannot run now. Whether the broker took it."""


def is_transient(exc: BaseException) -> bool:
    """The retry policy: :class:`TransientError`, and the network's own transient faults
    (``httpx.TransportError`` — connect errors and timeouts —, ``ConnectionError``, ``TimeoutError``),
    and a database an action writes to that dropped or refused its connection (SQLAlchemy's
    ``OperationalError``, or any error that invalidated the connection: a restarted PostgreSQL).

    Never retried: :class:`PermanentError` (replied as an error at once), :class:`StaleAttempt`
    and :class:`StepExpired` (the agent stops silently), and any other exception, which is a bug
    in the action and is replied as an error, so an operator sees it instead of a silent loop."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    # httpx's faults are looked for only once something has imported it (an action that raised
    # one has): a worker whose actions call their services otherwise does not load it.
    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, (TransientError, ConnectionError, TimeoutError, OperationalError))


def timeout_of(message: dict[str, Any]) -> float:
    """A step message's whole timeout (its ``budget`` as sent)."""
    return float(message.get("budget") or 0.0)


class Agent:
    """One remote service's agent. Declare actions with :meth:`action`."""

    def __init__(
        self,
        celery: Celery,
        name: str,
        *,
        retry_initial: float = 0.1,
        retry_max: float = 2.0,
        retry_jitter: bool = True,
        breaker_fail_max: int = 5,
        breaker_reset: float = 10.0,
        breaker_state: Callable[[], SharedState] | None = None,
        breaker_fresh: float = 0.0,
        rate_limit: str | None = None,
        rate_limit_key: Callable[[AgentCall], object] | None = None,
        rate_slots: Callable[[], Slots] | None = None,
        replies: Replies | None = None,
        db_clock: Callable[[], float | None] | None = None,
        inputs: Callable[[str, Any], Any] | None = None,
        queue_wait_max: float = 0.0,
        eager_steps: int = 0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``breaker_fail_max`` attempts in a row failing transiently (an attempt's in-process
        retries count once) open this agent's circuit breaker for ``breaker_reset`` seconds (0
        disables it); its state is kept in ``breaker_state()`` (Redis or
        the state store, each read trusted ``breaker_fresh`` seconds; by default this process's).
        ``rate_limit`` (``"20/s"``, ``"100/m"``) caps the calls of this agent's service by every
        worker process together, kept in ``rate_slots()`` (Redis or the state store; by default
        this process's): each call waits for its slot, or its step is deferred
        (:mod:`sas_app.agents.rate_limit`); with ``rate_limit_key(call)`` each key (a tenant, say)
        has that limit of its own. Concurrency is the ``-c`` of the workers consuming
        ``sas.agent.<name>``.

        With ``replies`` the agent hands its reply to the Scheduler's handler in its own process
        (the same transaction and fencing as on the Scheduler's queue, one message fewer per step);
        if that fails, or without, the reply goes to the Scheduler's queue (a broker that refuses
        it fails the task, visibly in Flower; the Supervisor recovers the step). With a
        ``db_clock`` (the state store's clock) a step's time left is measured against its
        complete-by on the database's clock, so a worker whose own clock is off still stops in time;
        a message taken past its complete-by (it waited in the queue) runs with a whole timeout if
        the store still wants its attempt, and is dropped otherwise; while that clock cannot be
        read (None) no step is run — its time left cannot be judged — and its message goes back
        to the queue for when the store answers.
        ``inputs(workflow, payload)`` turns a step's payload into what its action gets (the
        workflow's input model, parsed); a payload it refuses fails the step. With
        ``queue_wait_max`` (SAS_QUEUE_WAIT_MAX) and ``replies``, a message that waited in the
        queue until less than half its time was left starts again with its whole timeout, if the
        store still wants its attempt (:meth:`Replies.start_late`). With ``replies``, a step the
        reply starts that is this agent's own runs in this worker, without a message, up to
        ``eager_steps`` in a row (:mod:`sas_app.agents.handover`).
        ``clock`` measures the time a step has taken (this process's monotonic clock; the app's
        injected clock in tests), and ``sleep`` is what an in-process retry waits with (a virtual
        clock's in tests: time moves on, none passes)."""
        self.celery = celery
        self.name = name
        self.queue = agent_queue(name)
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.retry_jitter = retry_jitter
        if rate_limit_key is not None and rate_limit is None:
            raise WorkflowDefinitionError(f"agent {name!r}: rate_limit_key needs a rate_limit")
        self.rate_limit = (RateLimit(name, rate_limit, rate_slots or LocalSlots, key=rate_limit_key)
                           if rate_limit is not None else None)
        self.breaker = (
            Breaker(name, breaker_fail_max, breaker_reset, breaker_state or LocalState, counts=is_transient,
                    fresh=breaker_fresh)
            if breaker_fail_max > 0 else None
        )
        self.replies = replies
        self.db_clock = db_clock
        self.inputs = inputs
        self.queue_wait_max = queue_wait_max
        self.eager_steps = eager_steps if replies is not None else 0
        self.clock = clock
        self.sleep = sleep
        self.actions: dict[str, AgentAction[Any] | UndoAction[Any]] = {}

    @overload
    def action(self, fn: Callable[[AgentCall], Coroutine[Any, Any, R]], /) -> AgentAction[R]: ...

    @overload
    def action(self, fn: Callable[[AgentCall], R], /) -> AgentAction[R]: ...

    @overload
    def action(self, fn: None = None, /, *, name: str | None = None) -> ActionDecorator: ...

    def action(self, fn: Callable[[AgentCall], Any] | None = None, /, *, name: str | None = None
               ) -> AgentAction[Any] | ActionDecorator:
        """Decorator: register ``fn`` as the action ``<agent>.<name>`` (default: its own name)."""

        def register(fn: Callable[[AgentCall], Any]) -> AgentAction[Any]:
            action = AgentAction(self, self._new_name(name or fn.__name__), fn)
            self._register_task(action)
            return action

        return register(fn) if fn is not None else register

    @overload
    def undo(self, fn: Callable[[UndoCall], Coroutine[Any, Any, R]], /) -> UndoAction[R]: ...

    @overload
    def undo(self, fn: Callable[[UndoCall], R], /) -> UndoAction[R]: ...

    @overload
    def undo(self, fn: None = None, /, *, name: str | None = None) -> UndoDecorator: ...

    def undo(self, fn: Callable[[UndoCall], Any] | None = None, /, *, name: str | None = None
             ) -> UndoAction[Any] | UndoDecorator:
        """Decorator: register ``fn`` as the undo ``<agent>.<name>``, which a step names as its
        ``compensate``; ``fn`` receives an :class:`UndoCall` (``call.undoes`` is the step undone)."""

        def register(fn: Callable[[UndoCall], Any]) -> UndoAction[Any]:
            action = UndoAction(self, self._new_name(name or fn.__name__), fn)
            self._register_task(action)
            return action

        return register(fn) if fn is not None else register

    def _new_name(self, action_name: str) -> str:
        if action_name in self.actions:
            raise WorkflowDefinitionError(f"agent {self.name!r} already has an action {action_name!r}")
        return action_name

    def _register_task(self, action: AgentAction[Any] | UndoAction[Any]) -> None:
        self.actions[action.name] = action
        # Late acks with reject-on-worker-lost: a worker killed mid-step leaves the message to be
        # redelivered, not lost; the fencing token makes the second run harmless.
        @self.celery.task(
            name=agent_task_name(self.name, action.name),
            shared=False,
            acks_late=True,
            reject_on_worker_lost=True,
            ignore_result=True,
            Request=AgentRequest,
            bind=True,
        )
        def run_action(task: Any, **message: Any) -> None:
            soft = (task.request.timelimit or (None, None))[1] or task.soft_time_limit
            handover = Handover(self.name, self.actions, self.clock, None if not soft else self.clock() + soft,
                                self.eager_steps)
            redelivered = bool((task.request.delivery_info or {}).get("redelivered"))
            self.execute(action, message, handover, redelivered=redelivered)
            while (taken := handover.next()) is not None:
                # the message's arguments as the broker would have delivered them (JSON), under a
                # span of its own: there is no task of its own for Celery's instrumentation to trace
                with tracing.span("sas.eager_step", run_id=taken.run_id, position=taken.position,
                                  attempt=taken.attempt):
                    self.execute(self.actions[taken.action], json.loads(json.dumps(taken.kwargs)), handover,
                                 taken=taken)

    def execute(self, action: AgentAction[Any] | UndoAction[Any], message: dict[str, Any],
                handover: Handover | None = None, *, redelivered: bool = False,
                taken: AgentMessage | None = None) -> None:
        """Run one step's message (``taken``: a step this process took over from the reply of the
        step before it, with no message of its own in the broker)."""
        db_now = self.db_clock() if self.db_clock else None
        try:
            call = AgentCall.from_message(message, db_now, self.clock)
        except (KeyError, TypeError, ValueError) as exc:
            log.error("agent %s rejected a malformed message (%s): %r", action.qualname, exc, message)
            return
        where = f"{action.qualname} run {call.run_id} step {call.step} attempt {call.attempt}"
        if self.db_clock is not None and db_now is None:
            # Its time left cannot be judged: the message may have waited past its complete-by, and
            # a retry may be under way. Not run: back to the queue, for when the store answers
            # (dropping it would spend an attempt on the store's outage).
            if taken is not None and self.replies is not None:
                # no message of its own to hand back (a Reject would requeue the first step's)
                log.warning("%s: the database's clock cannot be read; not run, sent to its queue", where)
                self.replies.resend(taken)
                return
            log.warning("%s: the database's clock cannot be read; not run, back to the queue", where)
            self._back_to_the_queue(where)
        timeout = timeout_of(message)
        if call.budget < timeout / 2:
            if not self._taken_in_time(call, timeout, where):
                return
        elif redelivered and not self._still_running(call, where):
            return
        faults = FaultLog()
        if self.inputs is not None:
            try:
                call.payload = self.inputs(call.workflow, call.payload)
            except ValueError as exc:  # the workflow's model changed and refuses what was stored
                if call.undoes is None:
                    log.error("%s: %s", where, exc)
                    self._reply(STEP_FAILED, call, faults, error=str(exc))
                    return
                # an undo must still run: it gets the payload as stored
                log.warning("%s: %s; the undo gets the payload as stored", where, exc)
        try:
            result = self._call_with_retries(action, call, faults, where)
            json.dumps(result, allow_nan=False)
        except (StepExpired, SoftTimeLimitExceeded):
            log.warning("%s: complete-by passed; stopping without a reply", where)
            self._gave_up(call, faults)
            return
        except StaleAttempt as exc:
            log.warning("%s: superseded (%s); stopping without a reply", where, exc)
            self._keep_faults(call, faults)
            return
        except BreakerOpen as exc:
            if exc.fault is not None:  # this call's failure opened it
                faults.add(exc.fault)
            log.warning("%s: %s; deferring the step", where, exc)
            self._reply(STEP_DEFERRED, call, faults, delay=exc.delay, reason=str(exc))
            return
        except RateLimited as exc:
            log.info("%s: %s; deferring the step", where, exc)
            self._reply(STEP_DEFERRED, call, faults, delay=exc.delay, reason=str(exc))
            return
        except NotYet as exc:
            if call.remaining() <= 0:
                log.warning("%s: 'not yet' came after complete-by; not replying", where)
                self._gave_up(call, faults)
                return
            log.info("%s: not yet (poll %d)%s", where, call.poll + 1, f": {exc.detail}" if exc.detail else "")
            self._reply(STEP_NOT_YET, call, faults, after=exc.after, detail=exc.detail[:200])
            return
        except PermanentError as exc:
            log.info("%s: permanent fault: %s", where, describe(exc))
            self._reply(STEP_FAILED, call, faults, error=str(exc) or type(exc).__name__)
            return
        except Exception as exc:
            if is_transient(exc):
                log.warning("%s: still failing when complete-by came (%s); no reply", where, describe(exc))
                self._gave_up(call, faults)
                return
            log.exception("%s: unexpected error, reported as a permanent failure", where)
            self._reply(STEP_FAILED, call, faults, error=describe(exc))
            return
        fault_points.hit("agent.after_call")
        if call.remaining() <= 0:
            log.warning("%s: result came after complete-by; not replying", where)
            self._gave_up(call, faults)
            return
        with keeping(handover):
            # whether the run tells its submitter of its progress, as the message said: the
            # Scheduler then writes its notifications; otherwise it sends a narrower statement
            self._reply(STEP_DONE, call, faults, result=result, notify=bool(message.get("notify")))

    def _taken_in_time(self, call: AgentCall, timeout: float, where: str) -> bool:
        """Whether to run a message that waited in the queue: taken with less than half its step's
        ``timeout`` left, or past its complete-by. Waiting untaken is no failure, so with late
        starts on (``queue_wait_max``, and the store in this process) the agent asks the store to
        give the attempt a whole timeout from now; it runs if the store still wants that attempt
        and is dropped unrun otherwise. With them off, a message is run with what is left of its
        time, and one past its complete-by is dropped (the Supervisor retries the step). While
        the store cannot be asked, the message goes back to the queue a second later (Celery's
        ``Reject``, requeued): dropping it would spend an attempt on an outage."""
        if self.replies is None or self.queue_wait_max <= 0:
            if call.budget <= 0:
                log.warning("%s: waited in the queue past its complete-by; dropped unrun", where)
            return call.budget > 0
        try:
            restarted = self.replies.start_late(call.run_id, call.position, call.attempt)
            now = self.db_clock() if self.db_clock else None
        except Exception as exc:
            log.warning("%s: could not ask the store about a message that waited (%s); back to the queue", where,
                        describe(exc))
            self._back_to_the_queue(where)
        if restarted is None or now is None:
            log.warning("%s: waited in the queue and is no longer wanted; dropped unrun", where)
            return False
        log.info("%s: waited %.1fs in the queue; started now with its whole timeout, no failure counted", where,
                 timeout - call.budget)
        call.budget = restarted - now
        return call.budget > 0

    def _still_running(self, call: AgentCall, where: str) -> bool:
        """Whether to run a message the broker delivered a second time: its worker died after
        taking it — perhaps after the step completed (its acknowledgement comes when the task
        returns, which, with the steps a worker runs after it, can be much later). With the store
        in this process it is asked, and an attempt it no longer waits for is dropped unrun;
        otherwise, or while the store cannot be asked, the message runs (a completed attempt's
        reply is fenced out, and the service sees the same idempotency key)."""
        if self.replies is None:
            return True
        try:
            running = self.replies.still_running(call.run_id, call.position, call.attempt)
        except Exception as exc:
            log.warning("%s: delivered again, and the store cannot be asked (%s); run", where, describe(exc))
            return True
        if not running:
            log.warning("%s: delivered again after its attempt ended; dropped unrun", where)
        return running

    def _back_to_the_queue(self, where: str) -> NoReturn:
        """Hand the message back to its queue, unrun, a moment from now (Celery's ``Reject``,
        requeued; its worker does not spin on it meanwhile)."""
        self.sleep(STORE_DOWN_PAUSE)
        raise Reject(f"{where}: the store cannot be asked", requeue=True)

    def _call_with_retries(self, action: AgentAction[Any] | UndoAction[Any], call: AgentCall, faults: FaultLog,
                           where: str) -> Any:
        """The action, retried in-process on transient faults while complete-by allows. The
        breaker counts a failure once per attempt (its first try): one step retried here cannot
        open it for everyone, while failures of distinct steps in a row still do."""
        if call.remaining() <= 0:
            raise StepExpired(call.step)
        for attempt in Retrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential(multiplier=self.retry_initial, max=self.retry_max)
            + wait_random(0, self.retry_initial if self.retry_jitter else 0),
            stop=stop_before_delay(max(call.remaining(), 0.0)),
            sleep=self.sleep,
            reraise=True,
        ):
            with attempt:
                call.try_number = attempt.retry_state.attempt_number
                if call.remaining() <= 0:
                    raise StepExpired(call.step)
                if self.rate_limit is not None:
                    self.sleep(self.rate_limit.wait(call, call.remaining()))
                    if call.remaining() <= 0:
                        raise StepExpired(call.step)
                fault_points.hit("agent.before_call", call.step)
                try:
                    if self.breaker is None:
                        return self._invoke(action, call)
                    return self.breaker.call(partial(self._invoke, action), call, lasts=max(call.remaining(), 0.0),
                                             counted=call.try_number == 1)
                except Exception as exc:
                    if is_transient(exc):
                        log.info("%s try %d: transient fault: %s", where, call.try_number, faults.add(exc))
                    raise
        raise StepExpired(call.step)  # pragma: no cover - Retrying either returns or raises

    @staticmethod
    def _invoke(action: AgentAction[Any] | UndoAction[Any], call: AgentCall) -> Any:
        """One try of the action; an ``async def`` one runs on this thread's event loop and is
        cancelled at complete-by (:mod:`sas_app.agents.coroutines`)."""
        # an undo's task is sent an UndoCall; the undo checks it was (a step's message is refused)
        result = action(call) if isinstance(action, AgentAction) else action(cast(UndoCall, call))
        return run_bounded(result, max(call.remaining(), 0.0), call.step) if inspect.isawaitable(result) else result

    def _keep_faults(self, call: AgentCall, faults: FaultLog) -> None:
        """An attempt superseded while it ran ends without a reply: its faults are still written to
        its history."""
        if faults.count:
            self._reply(STEP_FAULTS, call, faults)

    def _gave_up(self, call: AgentCall, faults: FaultLog) -> None:
        """An attempt this agent took and stopped at its complete-by, without an answer: it says so
        (with its faults, if any), so that the Supervisor counts it a failed attempt. One that
        passes its complete-by in silence — its message lost, its worker gone whole — counts none,
        up to a limit: no worker tried it."""
        self._reply(STEP_FAULTS, call, faults, gave_up=True)

    def _reply(self, task: str, call: AgentCall, faults: FaultLog, **outcome: Any) -> None:
        """To the Scheduler's handler in this process, or failing that to its queue."""
        reply = {"run_id": call.run_id, "position": call.position, "attempt": call.attempt, **outcome}
        if task == STEP_DONE:
            reply["results"], reply["workflow"] = call.results, call.workflow
        summary = faults.summary()
        if summary is not None:  # only then: the reply of a step that went smoothly is unchanged
            reply["faults"] = summary
        name = task.rsplit(".", 1)[1]  # step_done, step_failed, step_deferred, step_not_yet, step_faults
        if self.replies is not None:
            handler: Callable[..., None] = getattr(self.replies, name)
            try:
                handler(**reply)
                return
            except Exception:
                log.exception("replying in process failed; sending the reply to the Scheduler's queue")
        self.celery.send_task(task, kwargs=reply, queue=SCHEDULER_QUEUE, headers=headers(Publish(name)),
                              **confirm_options(self.celery))
