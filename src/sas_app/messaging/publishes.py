"""Every message sas_app publishes after a commit, by name, with the row behind it.

A message is a hint; the state store is the truth. For each kind of publish below there is a row
with a due time that the Supervisor's sweep finds if the message is lost — whether the broker
dropped it, or the process died between its commit and the publish — so the run still ends as it
would have, only later. Each member's comment names that row. Every message carries its kind in
the header :data:`HEADER`, and ``tests/unit/test_message_loss.py`` drops each kind once and checks
that the run still ends as it would have: a new kind without such a test fails that test.

A notification (``reply_to``) is the one exception to "lost anywhere": its row is the outbox's,
marked sent once the broker has taken it, so a notification lost *after* the broker took it is
the broker's durability to keep (a durable queue; publisher confirms on RabbitMQ).
"""

from __future__ import annotations

from sas_app.states import Word

#: the message header that names a message's kind (a :class:`Publish` value)
HEADER = "sas_publish"


class Publish(Word):
    """What a message published after a commit is for; the comment says what recovers it."""

    # -- the Scheduler asked about a run (sas.scheduler.advance / advance_each) ---------------------
    #: a run written without its first move (no Scheduler in the submitting process, or many at
    #: once): the run is pending with a complete-by, re-asked by the sweep once it passes
    SUBMITTED = "submitted"
    #: a schedule's tick started a run: the same pending run's complete-by
    SCHEDULED = "scheduled"
    #: a step started a child run: the child, pending with a complete-by
    CHILD_STARTED = "child_started"
    #: a child run ended: its parent's step still running for it (the sweep's ``children_ended``)
    CHILD_ENDED = "child_ended"
    #: a child run is undone with its parent: the child's undos, pending with a complete-by
    CHILD_CANCELLED = "child_cancelled"
    #: a slot of a concurrency key came free: the next run in line, parked pending with a complete-by
    SLOT_FREED = "slot_freed"
    #: a step's back-off is over (its worker was lost, its agent deferred it, the planner waits for
    #: it): the step, pending with a complete-by at the end of its back-off plus the pick-up time
    BACKOFF = "backoff"
    #: the Supervisor retries steps past their complete-by: each pending with a new complete-by
    RETRY = "retry"
    #: the Supervisor asks again about runs and steps no Scheduler picked up: their complete-by,
    #: pushed forward by the sweep that asked
    REQUEUED = "requeued"
    #: the Supervisor failed runs for good (a step at its threshold, a deadline): their undos,
    #: pending with a complete-by
    UNDO = "undo"
    #: an operator resumed a run: the run's own complete-by (``RunTx.ask``), cleared when the
    #: Scheduler looks at it
    RESUMED = "resumed"
    #: an operator marked a step done: the run's own complete-by (``RunTx.ask``)
    MARKED_DONE = "marked_done"
    #: an operator resubmitted a run in error: the run's own complete-by (``RunTx.ask``)
    RESUBMITTED = "resubmitted"
    #: an operator (or a schedule) cancelled a run with something to undo: its undos, pending with a
    #: complete-by
    CANCELLED = "cancelled"
    #: an operator undid a run: its undos, pending with a complete-by
    COMPENSATE = "compensate"
    #: a signal was kept by a process without the run's workflow: the run's own complete-by (``RunTx.ask``)
    SIGNALLED = "signalled"

    # -- an agent asked to act (sas.agent.<agent>.<action>) ------------------------------------------
    #: a step dispatched: the step, running with its complete-by (the Supervisor retries it)
    DISPATCH = "dispatch"
    #: an undo dispatched: the undo, running with its complete-by
    UNDO_DISPATCH = "undo_dispatch"

    # -- an agent's reply to the Scheduler (sas.scheduler.step_*) -------------------------------------
    #: the step is still running with its complete-by: it is retried, and the remote service,
    #: deduplicating on the step's idempotency key, applies its effect once
    STEP_DONE = "step_done"
    STEP_FAILED = "step_failed"
    STEP_DEFERRED = "step_deferred"
    STEP_NOT_YET = "step_not_yet"
    #: reported by a worker's main process when its pool process died mid-step
    STEP_LOST = "step_lost"
    #: the transient faults of an attempt that ended without a reply (its complete-by passed): only
    #: history; the step, running with its complete-by, is retried by the Supervisor either way
    STEP_FAULTS = "step_faults"

    # -- a submitter's notification (its reply_to queue) ----------------------------------------------
    #: the outbox row, unsent until the broker has taken it: the sweep relays it under the same id
    NOTIFIED = "notified"


def headers(kind: Publish) -> dict[str, str]:
    """The headers of a message of ``kind``."""
    return {HEADER: kind.value}
