"""sas_app: the Scheduler Agent Supervisor pattern on plain Celery."""

from .agent import Agent, AgentCall
from .alerts import Alert
from .app import SasApp
from .client import RunHandle, RunView
from .errors import (
    DuplicateBusinessKey,
    InvalidOperation,
    InvalidSubmission,
    PermanentError,
    SasError,
    StaleAttempt,
    StepExpired,
    TransientError,
    UnknownRun,
    UnknownWorkflow,
    WorkflowDefinitionError,
)
from .migrate import migrate
from .settings import Settings
from .workflow import Sleep, Step, Workflow

__all__ = [
    "Agent",
    "AgentCall",
    "Alert",
    "DuplicateBusinessKey",
    "InvalidOperation",
    "InvalidSubmission",
    "PermanentError",
    "RunHandle",
    "RunView",
    "SasApp",
    "SasError",
    "Settings",
    "Sleep",
    "StaleAttempt",
    "Step",
    "StepExpired",
    "TransientError",
    "UnknownRun",
    "UnknownWorkflow",
    "Workflow",
    "WorkflowDefinitionError",
    "migrate",
]
