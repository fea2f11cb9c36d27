"""The words a run's history is written in: run states, step states, event kinds and why an attempt
was given up, each a string-valued enum whose values are what the store holds.

A member compares equal to its string (``RunState.PROCESSING == "processing"``), so rows read
back from the database (plain strings) compare with them directly.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A string-valued enum member that formats as its value (``f"{RunState.ERROR}"`` is
    ``error``), on every Python version we support."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class RunState(Word):
    """``runs.process_state``: the pattern's ProcessState, plus compensation and cancel."""

    PENDING = "pending"  # submitted; the Scheduler has not planned it yet
    PROCESSING = "processing"  # its steps are being run
    PROCESSED = "processed"  # every step completed: done
    ERROR = "error"  # stopped for an operator (a step failed with nothing to undo, an undo failed): an alert says why
    COMPENSATING = "compensating"  # a step failed for good: the completed steps' undos are running
    COMPENSATED = "compensated"  # undone as a whole: every completed step's undo ran
    CANCELLED = "cancelled"  # an operator cancelled it before it finished

    @property
    def finished(self) -> bool:
        """The run has ended (processed, error, compensated or cancelled): nothing more happens to
        it unless an operator acts."""
        return self.value in TERMINAL_RUN_STATES


class StepState(Word):
    """``steps.state``."""

    NOT_STARTED = "not_started"  # the steps before it have not completed yet
    PENDING = "pending"  # due to be sent to its agent (or asleep, or waiting for an event, in the store)
    RUNNING = "running"  # sent to its agent; its complete-by is running
    COMPLETED = "completed"  # its agent replied with a result
    FAILED = "failed"  # failed for good: a permanent error, or its attempts used up
    COMPENSATING = "compensating"  # its undo has been sent to its agent
    COMPENSATED = "compensated"  # its undo completed
    #: no longer wanted: its run is being undone and it has no undo (a late reply is fenced out)
    STOPPED = "stopped"
    #: not taken: its condition did not hold, or every step it waits for was skipped (never undone)
    SKIPPED = "skipped"


class EventKind(Word):
    """``events.kind``: what one row of a run's history records."""

    TRANSITION = "transition"  # a run (position NULL) or a step moved from_state → to_state
    ALERT = "alert"  # an alert was raised (its detail is the alert)
    STALE_REPLY = "stale_reply"  # a late or duplicate message refused by the fence
    REQUEUE = "requeue"  # the Supervisor asked the Scheduler again about a pending run or step
    OPERATOR = "operator"  # an operator acted (detail: action, by, reason)
    SIGNAL = "signal"  # a signal arrived for a wait (detail: event, status, by)
    FAULTS = "faults"  # an attempt's transient faults (detail: count, first, last), once it ended
    #: its message waited in its agent's queue past complete-by: left alone by the Supervisor
    #: (detail: left), given a moment once it left the queue for its agent to claim it (detail:
    #: taken), or taken late by its agent, which started its complete-by again (detail:
    #: started_late); no failure counted in any of these
    QUEUED = "queued"
    #: its agent took the attempt and stopped it at complete-by without an answer (the service
    #: hung, or kept failing): when the Supervisor recovers it, a failure is counted. An attempt
    #: that expires without this word (its message lost, its worker gone whole) counts none, up to
    #: ``max_failures`` times (``silent``)
    GAVE_UP = "gave_up"


class Cause(Word):
    """Why an attempt was given up: the ``reason`` of its running → pending event."""

    EXPIRED = "expired"  # its complete-by passed (found by the Supervisor)
    WORKER_LOST = "worker_lost"  # its worker process died (reported by the worker's main process)
    #: its agent did not call the service (its breaker open, or its rate limit full): no failure counted
    DEFERRED = "deferred"
    #: its complete-by passed and its agent never said it took it (a message lost with the broker, a
    #: worker killed whole): no failure counted, up to the step's ``max_failures`` such times
    SILENT = "silent"


class SignalStatus(Word):
    """``signals.status``: what became of a signal sent to a run."""

    KEPT = "kept"  # the run has not reached its wait yet: consumed when it does
    CONSUMED = "consumed"  # it ended its wait (its payload is the wait's result)
    IGNORED = "ignored"  # a second signal for a wait that has one already, or has ended: recorded only


#: ``steps.error`` of a step the Supervisor failed: nobody knows whether its effect was applied.
EXPIRED_ERROR = "complete-by passed"

RUN_STATES = tuple(s.value for s in RunState)
STEP_STATES = tuple(s.value for s in StepState)
#: step states that let the steps waiting for it go on: a step may start once each of its
#: dependencies is in one of these and at least one completed
SETTLED_STEP_STATES = (StepState.COMPLETED.value, StepState.SKIPPED.value)
#: run states in which the Scheduler still has work: its steps, or their undoing
LIVE_RUN_STATES = (RunState.PROCESSING.value, RunState.COMPENSATING.value)
#: run states a run never leaves
TERMINAL_RUN_STATES = (RunState.PROCESSED.value, RunState.ERROR.value, RunState.COMPENSATED.value,
                       RunState.CANCELLED.value)
#: an alert is current while its run is in one of these: in error (an operator's turn) or not finished
OPEN_RUN_STATES = (RunState.ERROR.value, RunState.PENDING.value, RunState.PROCESSING.value,
                   RunState.COMPENSATING.value)


class Role(Word):
    """Who may do what (``audit.role``, ``api_tokens.role``), each allowed what the ones before it are."""

    VIEWER = "viewer"  # reads runs and alerts
    APPROVER = "approver"  # also answers waits (sends signals)
    OPERATOR = "operator"  # also submits runs and acts on them, and reads the audit trail
    ADMIN = "admin"  # also manages access (tokens)
