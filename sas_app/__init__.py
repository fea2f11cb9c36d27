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
from .schedules import Overlap
from .settings import Settings
from .signals import SignalReceipt
from .states import RunState, StepState
from .steps import ChildRun, Escalate, OnTimeout, Output, Sleep, Step, StepDef, Then, WaitFor
from .store import RunRow, StepRow
from .workflow import Workflow

__all__ = [
    "Agent",
    "AgentAction",
    "AgentCall",
    "Alert",
    "ChildRun",
    "DuplicateBusinessKey",
    "Escalate",
    "InvalidOperation",
    "InvalidSignal",
    "InvalidSubmission",
    "OnTimeout",
    "Output",
    "Overlap",
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
    "StepDef",
    "StepExpired",
    "StepRow",
    "StepState",
    "Submission",
    "Submitted",
    "Then",
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
