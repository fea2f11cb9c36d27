"""Named failures, in the pattern's terms."""

from __future__ import annotations

from datetime import timedelta


def one_line(exc: BaseException) -> str:
    """An error as one line: its type and the first line of its message (SQLAlchemy's go on with
    the statement and its parameters)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class SasError(Exception):
    """Base of every error sas_app raises on purpose."""


class TransientError(SasError):
    """A fault worth retrying: the remote service is busy, unreachable or timed out.

    An agent retries it with back-off while the step's complete-by allows."""


class PermanentError(SasError):
    """A fault that retrying will not cure (a declined card, a malformed request).

    The agent reports it to the Scheduler at once: the step fails with one alert, and the run is
    undone (or goes to ``error`` when none of its steps has anything to undo)."""


class NotYet(SasError):
    """Raised by the action of a polling step (``Step(..., poll=Poll(...))``): the remote job it
    started or checked is not done. The step waits in the store, holding no message and no
    worker, and its action is called again after ``after`` seconds (or a ``timedelta``; left out,
    the step's ``Poll.every``), with the same idempotency key and ``call.poll`` one higher.
    ``detail`` (a short text: "rendering, 40%") goes into the step's history."""

    def __init__(self, after: float | timedelta | None = None, detail: str = "") -> None:
        seconds = after.total_seconds() if isinstance(after, timedelta) else after
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not seconds > 0 or seconds == float("inf")):
            raise ValueError(f"NotYet(after=...) must be a positive number of seconds or a timedelta, got {after!r}")
        super().__init__(detail or "not yet")
        self.after = None if seconds is None else float(seconds)
        self.detail = detail


class StepExpired(SasError):
    """The step's complete-by passed: the agent stops and sends nothing."""


class StaleAttempt(SasError):
    """This attempt has been superseded (the remote service saw a newer fencing token, or the
    store moved on): the agent stops and sends nothing."""


class UnknownWorkflow(SasError, LookupError):
    """No workflow is registered under that name."""


class UnknownRun(SasError, LookupError):
    """No run has that id."""


class WorkflowDefinitionError(SasError, ValueError):
    """A workflow or agent was declared wrongly; raised when it is registered."""


class InvalidSubmission(SasError, ValueError):
    """``submit`` was called with input the store must not accept; nothing was written."""


class InvalidOperation(SasError, ValueError):
    """An operator action the run's current state does not allow; nothing was changed."""


class DuplicateBusinessKey(InvalidSubmission):
    """The business key already names a run of this workflow with a different payload."""


class SchemaNotReady(SasError, RuntimeError):
    """The state store has no schema yet, or an older one than this sas_app needs: run ``sas migrate``."""


class InvalidSignal(SasError, ValueError):
    """A signal the run cannot take (it has ended, or never waits for that event); nothing was written."""


class NotAllowed(SasError, PermissionError):
    """Who asked may not do this: no credentials, a token that is unknown, revoked or expired, or a
    role below the one the action needs. ``status`` is the HTTP status the API answers with (401:
    who you are is not known; 403: known, and not allowed)."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status
