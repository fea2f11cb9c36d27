"""sas_app: the Scheduler Agent Supervisor pattern on plain Celery."""

from .actions import AgentAction, AgentCall, UndoAction, UndoCall, Undone
from .agent import Agent
from .alerts import Alert
from .app import SasApp
from .bulk import Submission, Submitted
from .client import RunHandle, RunView
from .errors import (
    DuplicateBusinessKey,
    InvalidOperation,
    InvalidSignal,
    InvalidSubmission,
    PermanentError,
    SasError,
    SchemaNotReady,
    StaleAttempt,
    StepExpired,
    TransientError,
    UnknownRun,
    UnknownWorkflow,
    WorkflowDefinitionError,
)
from .migrate import migrate
from .producer import Producer
from .settings import Settings
from .signals import SignalReceipt
from .states import RunState, StepState
from .store import RunRow, StepRow
from .workflow import Escalate, Sleep, Step, WaitFor, Workflow

__all__ = [
    "Agent",
    "AgentAction",
    "AgentCall",
    "Alert",
    "DuplicateBusinessKey",
    "Escalate",
    "InvalidOperation",
    "InvalidSignal",
    "InvalidSubmission",
    "PermanentError",
    "Producer",
    "RunHandle",
    "RunRow",
    "RunState",
    "RunView",
    "SasApp",
    "SasError",
    "SchemaNotReady",
    "Settings",
    "SignalReceipt",
    "Sleep",
    "StaleAttempt",
    "Step",
    "StepExpired",
    "StepRow",
    "StepState",
    "Submission",
    "Submitted",
    "TransientError",
    "UndoAction",
    "UndoCall",
    "Undone",
    "UnknownRun",
    "UnknownWorkflow",
    "WaitFor",
    "Workflow",
    "WorkflowDefinitionError",
    "migrate",
]
