"""sas_app: the Scheduler Agent Supervisor pattern on plain Celery."""

from .agent import Agent, AgentCall
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
from .workflow import Escalate, Sleep, Step, WaitFor, Workflow

__all__ = [
    "Agent",
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
    "Submission",
    "Submitted",
    "TransientError",
    "UnknownRun",
    "UnknownWorkflow",
    "WaitFor",
    "Workflow",
    "WorkflowDefinitionError",
    "migrate",
]
