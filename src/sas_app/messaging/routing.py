"""Where every message goes, and the one policy for sending it after a commit.

Queue and task names, the task id of each dispatch, the idempotency keys, and :class:`Router`,
through which the client, the operators, the Scheduler and the Supervisor all publish. Publishing
always follows a commit, so a message is only ever a hint: when the broker refuses one the state
is already in the store, and the Supervisor finds it past its complete-by and asks again. The
policy is therefore the same everywhere: publish; on failure, log and leave the recovery to the
Supervisor — never report a committed change as failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kombu.entity import Exchange, Queue

from sas_app.messaging.publishes import Publish, headers
from sas_app.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)

#: How long a publish waits for the broker's confirm (RabbitMQ) before it is retried.
CONFIRM_TIMEOUT = 5.0

#: the Scheduler's queue: what to plan next, and the agents' replies
SCHEDULER_QUEUE = "sas.scheduler"
#: the Supervisor's queue: its sweeps, and beat's schedule ticks and purges
SUPERVISOR_QUEUE = "sas.supervisor"

#: ask the Scheduler to plan a run's next steps (after a submit, a signal, an operator's action)
ADVANCE = "sas.scheduler.advance"
#: the Supervisor's batch: ask about each of several runs (one message, not one per run)
ADVANCE_EACH = "sas.scheduler.advance_each"
#: an agent's reply: the step's result
STEP_DONE = "sas.scheduler.step_done"
#: an agent's reply: the step failed (permanently, or this attempt)
STEP_FAILED = "sas.scheduler.step_failed"
#: an agent's reply: its breaker is open, the step was not tried (no failure counted)
STEP_DEFERRED = "sas.scheduler.step_deferred"
#: an agent's reply: a polling step's job is not done yet (ask again later; no failure counted)
STEP_NOT_YET = "sas.scheduler.step_not_yet"
#: an agent worker's main process: the worker running the step died
STEP_LOST = "sas.scheduler.step_lost"
#: an attempt's transient faults, kept in the run's history once the attempt ended
STEP_FAULTS = "sas.scheduler.step_faults"
#: sent by beat every SAS_SUPERVISOR_INTERVAL: the Supervisor's sweep
SWEEP = "sas.supervisor.sweep"
#: the at-risk look (not a task: each Supervisor worker's lookout takes one every
#: SAS_AT_RISK_INTERVAL, see sas_app.supervision.forecast.lookout), by this name in the ``looks`` table
WATCH = "sas.supervisor.watch"
#: sent by beat: start the runs of the schedules' ticks due (on the Supervisor's queue): see
#: sas_app.interfaces.schedules
TICK = "sas.schedules.tick"
#: sent by beat when SAS_RETENTION is set: delete finished runs past it (on the Supervisor's queue)
PURGE = "sas.retention.purge"
#: sent by producers that have only the broker: submit a run (on the Scheduler's queue): see
#: sas_app.interfaces.client
SUBMIT = "sas.submit"
#: sent by producers to end a run's wait (on the Scheduler's queue): see sas_app.interfaces.signals
SIGNAL = "sas.signal"


def agent_queue(agent: str) -> str:
    return f"sas.agent.{agent}"


def agent_task_name(agent: str, action: str) -> str:
    return f"sas.agent.{agent}.{action}"


def dispatch_task_id(run_id: str, position: int, attempt: int) -> str:
    """The Celery task id of one dispatch of a step: the same in the store's history, in Flower
    and in the dashboard's links, with nothing stored."""
    return f"{run_id}-{position}-{attempt}"


def step_key(run_id: str, step: str) -> str:
    """A step's idempotency key: the same on every attempt, so the remote service applies it once."""
    return f"{run_id}:{step}"


def branch_key(key: str, index: int) -> str:
    """The idempotency key of branch ``index`` of the ``for_each`` step whose key is ``key``."""
    return f"{key}:{index}"


def undo_key(key: str) -> str:
    """The idempotency key of the undo of the step whose key is ``key``."""
    return f"{key}:undo"


def reply_queue(name: str) -> Queue:
    """A submitter's ``reply_to`` queue, with a direct exchange of the same name."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name, durable=True)


@dataclass(frozen=True)
class Notification:
    """A progress message for a submitter's ``reply_to`` queue; ``body["id"]`` never changes."""

    id: int
    reply_to: str
    body: dict[str, Any]


@dataclass(frozen=True)
class Advance:
    """Ask the Scheduler about a run, after ``delay`` seconds (a back-off not yet over); ``why``
    names the publish (:class:`Publish`: what recovers it if it is lost)."""

    run_id: str
    why: Publish
    delay: float = 0.0

    def __str__(self) -> str:
        return f"the Scheduler's message for run {self.run_id}"


@dataclass(frozen=True)
class AdvanceEach:
    """Ask the Scheduler about each of ``run_ids``, after ``delay`` seconds: one message for a
    batch the Supervisor recovered, where an :class:`Advance` each would cost the broker and the
    Scheduler's worker a message per run."""

    run_ids: tuple[str, ...]
    why: Publish
    delay: float = 0.0

    def __str__(self) -> str:
        return f"the Scheduler's message for {len(self.run_ids)} runs"


def asking(run_ids: Sequence[str], why: Publish, delay: float = 0.0) -> Advance | AdvanceEach:
    """The Scheduler's message about ``run_ids``: an :class:`Advance` for one run (as Flower
    shows it, with its id), an :class:`AdvanceEach` for more."""
    return Advance(run_ids[0], why, delay) if len(run_ids) == 1 else AdvanceEach(tuple(run_ids), why, delay)


#: what Flower shows of an agent's message (see AgentMessage.describe)
SHOWN = ("run_id", "business_key", "workflow", "step", "position", "attempt", "index")


@dataclass(frozen=True)
class AgentMessage:
    """One dispatch of a step to its agent's queue."""

    agent: str
    action: str
    run_id: str
    position: int
    attempt: int
    timeout: float
    urgency: int
    kwargs: dict[str, Any]
    why: Publish

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.position} attempt {self.attempt}"

    def describe(self) -> str:
        """The message's arguments as Celery's events (and so Flower) show them: which step of which
        run, without its input and earlier results. Celery would otherwise build a safe repr of the
        whole message, a tenth of a millisecond for every step sent."""
        shown = {key: self.kwargs[key] for key in SHOWN if key in self.kwargs}
        return repr(shown)


Message = Advance | AdvanceEach | AgentMessage


#: what takes this thread's next dispatch instead of the broker, while :func:`keeping` says so
_KEEPER: ContextVar[Callable[[AgentMessage], bool] | None] = ContextVar("sas_keeper", default=None)


@contextmanager
def keeping(keeper: Callable[[AgentMessage], bool] | None) -> Iterator[None]:
    """While inside, every step this thread dispatches is offered to ``keeper`` first: one it
    takes (True) is not published — the keeper runs it (see :mod:`sas_app.agents.handover`)."""
    token = _KEEPER.set(keeper)
    try:
        yield
    finally:
        _KEEPER.reset(token)


def confirm_options(celery: Celery) -> dict[str, Any]:
    """Options for a publish: with publisher confirms (RabbitMQ) wait at most CONFIRM_TIMEOUT for
    one, then the publish is retried (a message twice is harmless; one never sent is what the
    Supervisor recovers) rather than waiting for ever on a broker that does not answer."""
    options = celery.conf.broker_transport_options or {}
    return {"confirm_timeout": CONFIRM_TIMEOUT} if options.get("confirm_publish") else {}


class Router:
    """Publishes after a commit: notifications first, then the messages, so a submitter hears of a
    step before anything that follows it. ``mark_sent`` records relayed notifications (the store's)."""

    def __init__(self, celery: Celery, settings: Settings, mark_sent: Callable[[Sequence[int]], None]) -> None:
        self.celery = celery
        self.settings = settings
        self.mark_sent = mark_sent
        self.confirm = confirm_options(celery)
        # RabbitMQ closes the channel of a consumer holding a message unacknowledged past its
        # consumer timeout, and Celery holds a message with a countdown unacknowledged until it is
        # due: a longer wait is asked in hops (an Advance that comes early makes the planner wait
        # again for what is left).
        self.longest_countdown = settings.broker_consumer_timeout / 2 if settings.amqp_broker else None

    def after_commit(self, notes: Sequence[Notification], *messages: Message | None) -> None:
        self.relay(notes)
        for message in messages:
            if message is not None:
                self.send(message)

    def send(self, message: Message) -> bool:
        """Publish one message; False (logged) if the broker refused it."""
        try:
            if isinstance(message, Advance):
                self.celery.send_task(ADVANCE, args=[message.run_id], queue=SCHEDULER_QUEUE,
                                      countdown=self._countdown(message.delay), argsrepr=f"['{message.run_id}']",
                                      headers=headers(message.why), **self.confirm)
            elif isinstance(message, AdvanceEach):
                self.celery.send_task(ADVANCE_EACH, args=[list(message.run_ids)], queue=SCHEDULER_QUEUE,
                                      countdown=self._countdown(message.delay),
                                      argsrepr=f"[{len(message.run_ids)} runs]", headers=headers(message.why),
                                      **self.confirm)
            else:
                keeper = _KEEPER.get()
                if keeper is not None and keeper(message):
                    return True
                self.celery.send_task(
                    agent_task_name(message.agent, message.action),
                    task_id=dispatch_task_id(message.run_id, message.position, message.attempt),
                    kwargs=message.kwargs,
                    queue=agent_queue(message.agent),
                    priority=self.broker_priority(message.urgency),
                    # a backstop checked on the consuming worker's clock (see Settings.clock_skew),
                    # past the time the step may wait in the queue untaken (Settings.queue_wait_max)
                    expires=message.timeout + self.settings.clock_skew + self.settings.queue_wait_max,
                    soft_time_limit=message.timeout + 1,
                    time_limit=message.timeout + 5,
                    argsrepr="()",
                    kwargsrepr=message.describe(),
                    headers=headers(message.why),
                    **self.confirm,
                )
            return True
        except Exception:
            log.exception("could not publish %s; it is committed, so the Supervisor will recover it", message)
            return False

    def answer(self, reply_to: str, body: dict[str, Any]) -> bool:
        """Publish ``body`` to a submitter's ``reply_to`` queue, for an answer nothing was written
        for (a refused submission); False (logged) if the broker refused it."""
        try:
            with self.celery.producer_pool.acquire(block=True) as producer:
                queue = reply_queue(reply_to)
                producer.publish(body, exchange=queue.exchange, routing_key=reply_to, declare=[queue],
                                 serializer="json", retry=True, retry_policy=self.retry_policy, **self.confirm)
            return True
        except Exception:
            log.exception("could not answer on %s", reply_to)
            return False

    def relay(self, notes: Sequence[Notification]) -> None:
        """Publish committed notifications, then mark them sent. Failures are left to the Supervisor,
        which relays what is left under the same ids."""
        if not notes:
            return
        try:
            with self.celery.producer_pool.acquire(block=True) as producer:
                for note in notes:
                    queue = reply_queue(note.reply_to)
                    producer.publish(note.body, exchange=queue.exchange, routing_key=note.reply_to,
                                     declare=[queue], serializer="json", retry=True, retry_policy=self.retry_policy,
                                     headers=headers(Publish.NOTIFIED), **self.confirm)
            self.mark_sent([n.id for n in notes])
        except Exception:
            log.exception("could not relay %d notification(s); the Supervisor will", len(notes))

    def _countdown(self, delay: float) -> float | None:
        """A Scheduler message's countdown: ``delay``, capped at the broker's longest if it has one."""
        if self.longest_countdown is not None:
            delay = min(delay, self.longest_countdown)
        return delay or None

    @property
    def retry_policy(self) -> dict[str, Any]:
        """Celery's publish retry policy (bounded: kombu's own default retries forever)."""
        return dict(self.celery.conf.task_publish_retry_policy)

    def broker_priority(self, urgency: int) -> int:
        """Our 0-9 urgency as the broker counts it: Redis serves 0 first, AMQP serves 9 first."""
        return 9 - urgency if self.settings.broker_url.startswith(("redis", "rediss")) else urgency
