"""sas_app: the Scheduler Agent Supervisor pattern on plain Celery."""

from sas_app.agents.agent import Agent
from sas_app.app import SasApp
from sas_app.definitions.actions import AgentAction, AgentCall, UndoAction, UndoCall, Undone
from sas_app.definitions.conditions import StepContext
from sas_app.definitions.steps import (
    ChildRun,
    Escalate,
    OnTimeout,
    Output,
    Poll,
    Sleep,
    Step,
    StepDef,
    Then,
    WaitFor,
)
from sas_app.definitions.workflow import Workflow
from sas_app.engine.alerts import Alert
from sas_app.errors import (
    DuplicateBusinessKey,
    InvalidOperation,
    InvalidSignal,
    InvalidSubmission,
    NotYet,
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
from sas_app.interfaces.bulk import Submission, Submitted
from sas_app.interfaces.client import RunHandle, RunView
from sas_app.interfaces.notifications import Notifications
from sas_app.interfaces.producer import Producer
from sas_app.interfaces.schedules import Overlap
from sas_app.interfaces.signals import SignalReceipt
from sas_app.settings import Settings
from sas_app.states import Cause, EventKind, RunState, SignalStatus, StepState
from sas_app.store import RunRow, StepRow
from sas_app.store.migrate import migrate

__all__ = [
    "Agent",
    "AgentAction",
    "AgentCall",
    "Alert",
    "Cause",
    "ChildRun",
    "DuplicateBusinessKey",
    "Escalate",
    "EventKind",
    "InvalidOperation",
    "InvalidSignal",
    "InvalidSubmission",
    "NotYet",
    "Notifications",
    "OnTimeout",
    "Output",
    "Overlap",
    "PermanentError",
    "Poll",
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
    "SignalStatus",
    "Sleep",
    "StaleAttempt",
    "Step",
    "StepContext",
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
