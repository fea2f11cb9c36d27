"""What each agent has to do now, read from the steps table: the number a fleet scales its agent
workers on (``sas backlog``, the ``sas_agent_backlog`` gauge, the Kubernetes ``ScaledObject``).

A broker's queue length misses the messages a worker has taken and not yet acknowledged, and
knows nothing of a step about to be sent; the store knows each live step's state. Per agent:

* ``due`` — pending steps ready to be sent now (no back-off left);
* ``dispatched`` — running steps: sent to the agent, in its queue or being worked on;
* ``retrying`` — pending steps backing off before their next attempt (work that comes back soon);
* ``oldest`` — seconds since the longest-dispatched running step was sent.

Read on the live-steps partial index (``complete_by IS NOT NULL AND state IN ('pending',
'running')``): the cost follows the number of live steps, never the table's size. Steps waiting
in the store (sleeps, waits for an event, child runs) belong to no agent and are left out, and so
are pending steps that cannot be sent however many workers there are: those of a paused run, and
the undos queued behind the one being done (a run is undone one step at a time).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import and_, case, exists, func, or_, select

from sas_app.states import LIVE_RUN_STATES, StepState
from sas_app.store.database import Store
from sas_app.store.tables import WAITING_FOR_RESUME, runs, steps
from sas_app.store.transitions import run_in

#: the counts of a backlog that are states of its steps (``sas_agent_backlog``'s ``state`` label)
BACKLOG_STATES = ("due", "dispatched", "retrying")


@dataclass(frozen=True)
class AgentBacklog:
    """One agent's backlog (see the module's docstring)."""

    agent: str
    due: int = 0
    dispatched: int = 0
    retrying: int = 0
    oldest: float = 0.0

    @property
    def outstanding(self) -> int:
        """Steps the agent's workers must take now: due plus dispatched (what a fleet scales on)."""
        return self.due + self.dispatched

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outstanding": self.outstanding}


def backlog(store: Store, agents: list[str] | tuple[str, ...] = ()) -> list[AgentBacklog]:
    """Each agent's backlog, by name; every agent in ``agents`` is listed (with zeros when it has
    nothing to do), and any other agent with live steps too."""
    with store.begin() as tx:
        now = tx.now()
        running = steps.c.state == StepState.RUNNING.value
        earlier = steps.alias("earlier")
        queued_undo = and_(steps.c.compensates.is_not(None), exists().where(
            earlier.c.run_id == steps.c.run_id, earlier.c.compensates.is_not(None),
            earlier.c.position < steps.c.position, earlier.c.state != StepState.COMPLETED.value))
        pending = and_(steps.c.state == StepState.PENDING.value, ~WAITING_FOR_RESUME, ~queued_undo)
        backing_off = and_(pending, steps.c.not_before.is_not(None), steps.c.not_before > now)
        due = and_(pending, or_(steps.c.not_before.is_(None), steps.c.not_before <= now))
        query = (
            select(steps.c.agent,
                   func.count().filter(running),
                   func.count().filter(backing_off),
                   func.count().filter(due),
                   func.min(case((running, steps.c.complete_by - steps.c.timeout))))
            .join(runs, runs.c.id == steps.c.run_id)
            .where(steps.c.complete_by.is_not(None),
                   steps.c.state.in_((StepState.PENDING.value, StepState.RUNNING.value)),
                   steps.c.agent != "", steps.c.child.is_(None),
                   or_(steps.c.state == StepState.RUNNING.value,
                       and_(steps.c.sleep.is_(None), steps.c.sleep_until.is_(None), steps.c.event.is_(None))),
                   run_in(*LIVE_RUN_STATES))
            .group_by(steps.c.agent)
        )
        found = {agent: AgentBacklog(agent, due=int(due), dispatched=int(dispatched), retrying=int(retrying),
                                     oldest=round(max(now - first, 0.0), 3) if first is not None else 0.0)
                 for agent, dispatched, retrying, due, first in tx.conn.execute(query)}
    return [found.get(name, AgentBacklog(name)) for name in sorted({*agents, *found})]
