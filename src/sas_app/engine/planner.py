"""What a run does next, decided inside the transaction that holds its lock: which steps start
(every workflow step whose dependencies have completed or were skipped and whose condition holds,
the branches a ``for_each`` step has room for, or the next undo while compensating), which are
skipped, whether the run is finished, and which step cannot start at all (its list is missing or
too long, its action is gone from the deployed code, its condition raised).

The :class:`Planner` makes the transitions and returns :class:`Moves`: the alerts to emit and the
agent messages to send once that transaction commits (the Scheduler sends them).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sas_app.definitions.conditions import Guard
from sas_app.definitions.workflow import Workflow
from sas_app.engine.alerts import Alert, Alerts
from sas_app.engine.choices import decide
from sas_app.engine.graph import Graph, fan_out_list, step_input, to_start
from sas_app.engine.recovery import fail_run
from sas_app.engine.waits import plan_waits
from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import Advance, AgentMessage
from sas_app.settings import Settings, instance_id
from sas_app.states import TERMINAL_RUN_STATES, RunState, StepState
from sas_app.store import RunRow, StepRow, Tx
from sas_app.store.children import child_key

log = logging.getLogger(__name__)

#: the most urgent a message can be (a run's priority is 0-9)
URGENT = 9


@dataclass(frozen=True)
class Dispatch:
    """An agent message to send once the transaction that marked its step running commits."""

    run: RunRow
    step: StepRow
    results: dict[str, Any]
    undoes: StepRow | None = None

    def message(self) -> AgentMessage:
        step = self.step
        # An undo overtakes whatever waits on its agent's queue: behind a backlog deeper than its
        # complete-by it would expire again and again while the new work ahead of it goes first, its
        # effect left standing. Only an undo: retries sent first starve the first attempts behind
        # them in a lasting backlog (docs/explanation/measurements-behind-the-code.md).
        urgency = URGENT if self.undoes is not None else self.run.priority
        why = Publish.DISPATCH if self.undoes is None else Publish.UNDO_DISPATCH
        return AgentMessage(step.agent, step.action, step.run_id, step.position, step.attempt, step.timeout,
                            urgency, self.kwargs(), why)

    def kwargs(self) -> dict[str, Any]:
        kwargs = {
            "run_id": self.run.id,
            "business_key": self.run.business_key,
            "workflow": self.run.workflow,
            "step": self.step.name,
            "position": self.step.position,
            "attempt": self.step.attempt,
            "idempotency_key": self.step.idempotency_key,
            "payload": step_input(self.run, self.step),
            "results": self.results,
            "complete_by": self.step.complete_by,
            "budget": self.step.timeout,
            "undoes": None if self.undoes is None else {
                "step": self.undoes.name, "idempotency_key": self.undoes.idempotency_key,
            },
        }
        if self.step.is_branch:
            kwargs["item"], kwargs["index"] = self.step.item, self.step.branch
        if self.step.polls:
            kwargs["poll"] = self.step.polls
        if self.run.reply_to is not None:  # handed back in the agent's reply (Scheduler.step_done)
            kwargs["notify"] = True
        return kwargs


#: answers whether this deployment's code has ``agent.action`` (None: it cannot tell, having no agents)
HasAction = Callable[[str, str], "bool | None"]


@dataclass
class Moves:
    """What one transaction decided to do once it commits: alerts to emit, agents to call, and
    when to look at the run again (a back-off not over)."""

    messages: list[Dispatch | Advance] = field(default_factory=list)
    alerts: list[Alert | None] = field(default_factory=list)

    def extend(self, other: Moves) -> None:
        for message in other.messages:
            if isinstance(message, Advance) and message.delay > 0:
                self.wait(message.run_id, message.delay)
            else:
                self.messages.append(message)
        self.alerts += other.alerts

    def wait(self, run_id: str, seconds: float) -> None:
        """Look at ``run_id`` again in ``seconds`` (the soonest of the back-offs asked for)."""
        later = next((m for m in self.messages if isinstance(m, Advance) and m.delay > 0), None)
        if seconds > 0 and (later is None or seconds < later.delay):
            self.messages = [m for m in self.messages if m is not later]
            self.messages.append(Advance(run_id, Publish.BACKOFF, seconds))


class Planner:
    def __init__(self, settings: Settings, alerts: Alerts, has_action: HasAction | None = None,
                 workflows: Mapping[str, Workflow] | None = None) -> None:
        self.settings = settings
        self.alerts = alerts
        self.has_action = has_action
        #: the deployment's registered workflows, which child steps start (None: it cannot tell)
        self.workflows = workflows

    def next(self, tx: Tx, run: RunRow) -> Moves:
        """Within the run's transaction: start every step that may start now (or the next undo,
        while compensating), or finish the run when nothing is left. The run has been looked at:
        a complete-by it had for being asked about is cleared (:meth:`RunTx.ask`)."""
        moves = Moves()
        tx.runs.looked_at(run)
        self._plan(tx, run, moves)
        return moves

    def _plan(self, tx: Tx, run: RunRow, moves: Moves) -> None:
        if run.process_state == RunState.PROCESSING and run.paused_by is None:
            self._plan_steps(tx, run, moves)
        elif run.process_state == RunState.COMPENSATING:
            self._plan_undo(tx, run, moves)

    def _plan_steps(self, tx: Tx, run: RunRow, moves: Moves) -> None:
        """Start the workflow steps whose dependencies have completed, and the branches their
        ``for_each`` steps have room for; complete a ``for_each`` step whose branches all have.
        A step that cannot start (its list is missing or too long, its action is gone from the
        deployed code) fails before anything is dispatched, and the run is undone."""
        while True:
            graph = Graph(tx.steps.steps_of(run.id))
            if graph.done():
                tx.runs.finish_run(run.id, RunState.PROCESSED, actor=instance_id())
                log.info("run %s (%s %s) processed", run.id, run.workflow, run.business_key)
                return
            ended = self._children_ended(tx, run, graph, moves)
            if ended == "failed":
                return
            if ended == "completed":
                continue  # what waited for those steps may start now
            results = graph.results()
            decided = decide(run, graph, graph.ready(), results, self.guard_of)
            if decided.failed is not None:  # a condition raised, or is gone: an operator's turn
                self._refuse(tx, run, *decided.failed, moves, undo=False)
                return
            skipped = [tx.steps.skip_step(step, reason, instance_id()) for step, reason in decided.skipped]
            ready = decided.taken
            starting = [s for s in ready if s.for_each is None and s.child is None and not s.in_store]
            children = [s for s in ready if s.child is not None]
            waited = plan_waits(tx, run, results, [s for s in ready if s.in_store], self.settings)
            if waited.failed is not None:
                self._refuse(tx, run, waited.failed, waited.reason, moves, undo=waited.undo)
                return
            # a fan-out's list is read when it starts (from an operator's edited input, if any)
            lists = {s.position: fan_out_list(s.for_each, step_input(run, s), results, self.settings.max_branches)
                     for s in ready if s.for_each is not None}
            for parent in graph.fanning_out():
                starting += to_start(graph.branches(parent), parent.max_parallel or 1)
            problems: list[tuple[StepRow, Any]] = [(s, self.refusal(s, run)) for s in starting + children]
            problems += [(graph.at(p), self.refusal(graph.at(p)) or r) for p, r in lists.items()]
            refused = next(((s, r) for s, r in problems if isinstance(r, str)), None)
            if refused is not None:
                self._refuse(tx, run, *refused, moves)
                return
            changed = False
            for parent in graph.fanning_out():
                branches = graph.branches(parent)
                if all(b.state == StepState.COMPLETED for b in branches):
                    changed |= tx.fan_out.complete_fan_out(run, parent, [b.result for b in branches], instance_id())
            first_free = graph.next_free()
            for position, items in lists.items():
                assert isinstance(items, list)
                changed |= tx.fan_out.start_fan_out(graph.at(position), items, first_free, instance_id())
                first_free += len(items)
            for step in children:
                self._start_child(tx, run, step, moves)
            for step in starting:
                running = tx.steps.mark_step_running(step, instance_id())
                if running is not None:
                    moves.messages.append(Dispatch(run, running, results))
                elif step.not_before is not None and step.not_before - tx.now() <= self.settings.retry_backoff_max:
                    moves.wait(run.id, step.not_before - tx.now())  # a back-off; a longer wait is the sweep's
            if not changed and not waited.ended and not any(skipped):
                return

    def _plan_undo(self, tx: Tx, run: RunRow, moves: Moves) -> None:
        """The next undo, one at a time, last step first; the run ends once all are done."""
        steps = tx.steps.steps_of(run.id)
        final = RunState.CANCELLED if run.cancelled_by else RunState.COMPENSATED
        for step in (s for s in steps if s.is_undo):
            if step.state == StepState.COMPLETED:
                continue
            if step.state not in (StepState.NOT_STARTED, StepState.PENDING):
                return  # running or failed: an agent or the Supervisor owns it
            reason = self.refusal(step)
            if reason:
                self._refuse(tx, run, step, reason, moves)
                return
            running = tx.steps.mark_step_running(step, instance_id())
            if running is not None:
                undoes = next(s for s in steps if s.position == running.compensates)
                moves.messages.append(Dispatch(run, running, Graph(steps).results(), undoes))
            elif step.not_before is not None:
                moves.wait(run.id, step.not_before - tx.now())
            return
        tx.runs.finish_run(run.id, final, from_state=run.process_state, actor=instance_id())
        log.info("run %s (%s %s) %s", run.id, run.workflow, run.business_key, final)

    def dispatch(self, tx: Tx, run: RunRow, step: StepRow, results: dict[str, Any]) -> Moves:
        """A step the hot path has just marked running: its message, unless its action has gone
        from the deployed code (then it fails, and the run is undone)."""
        moves = Moves()
        reason = self.refusal(step)
        if reason:
            self._refuse(tx, run, step, reason, moves)
        else:
            moves.messages.append(Dispatch(run, step, results))
        return moves

    def _start_child(self, tx: Tx, run: RunRow, step: StepRow, moves: Moves) -> None:
        """Start ``step``'s child run (pending, asked of the Scheduler once this commits)."""
        assert self.workflows is not None and step.child is not None
        workflow = self.workflows[step.child]
        child_id = uuid.uuid4().hex
        started = tx.children.start_child_step(step, child_id, instance_id())
        if started is None:
            return
        child, _ = tx.submission.insert_run(workflow.new_run(
            child_id, child_key(run.id, step.name, started.attempt), workflow.stored_input(step_input(run, step)),
            priority=run.priority,
            parent_run_id=run.id, parent_position=step.position, depth=run.depth + 1,
        ), self.settings.pickup_timeout)
        moves.messages.append(Advance(child.id, Publish.CHILD_STARTED))

    def _children_ended(self, tx: Tx, run: RunRow, graph: Graph, moves: Moves) -> str | None:
        """Steps waiting for a child run that has ended: processed, the step completes with its
        results ("completed"); otherwise it fails, and this run is undone ("failed")."""
        waiting = [s for s in graph.workflow_steps if s.child is not None and s.state == StepState.RUNNING]
        if not waiting:
            return None
        outcome = None
        children = {c.business_key: c for c in tx.children.children_of(run.id)}
        for step in waiting:
            child = children.get(child_key(run.id, step.name, step.attempt))
            if child is None or child.process_state not in TERMINAL_RUN_STATES:
                continue
            if child.process_state == RunState.PROCESSED:
                if tx.children.finish_child_step(step, child, Graph(tx.steps.steps_of(child.id)).results(),
                                                 instance_id()):
                    outcome = "completed"
                continue
            reason = f"step {step.name!r}: child run {child.id} ({child.workflow}) ended {child.process_state}"
            if child.error:
                reason += f": {child.error}"
            failed = tx.steps.fail_step(run.id, step.position, step.attempt, reason, actor=instance_id(),
                                        count_failure=True)
            if failed is not None:
                self._fail_run(tx, run, failed, reason, moves)
                return "failed"
        return outcome

    def guard_of(self, run: RunRow, step: StepRow) -> Guard | str:
        """``step``'s condition written as a function, from the deployed workflow; or why it is
        not there (the workflow gone, or the step's condition changed since the run started)."""
        workflow = None if self.workflows is None else self.workflows.get(run.workflow)
        spec = None if workflow is None else next((s for s in workflow.specs if s.name == step.name), None)
        if spec is not None and spec.guard is not None and spec.guard.stored == step.condition:
            return spec.guard
        return (f"step {step.name!r}: its condition `{step.condition}` is not in the deployed code (the "
                "workflow or the step changed since the run started)")

    def refusal(self, step: StepRow, run: RunRow | None = None) -> str | None:
        """Why ``step`` cannot be dispatched (or its child run started) by this deployment, if it cannot."""
        if step.child is not None:
            if self.workflows is not None and step.child not in self.workflows:
                return (f"step {step.name!r}: child workflow {step.child!r} is not in the deployed code "
                        "(removed or renamed since the run started)")
            if run is not None and run.depth + 1 > self.settings.max_child_depth:
                return (f"step {step.name!r}: its child run would nest {run.depth + 1} deep, over "
                        f"SAS_MAX_CHILD_DEPTH ({self.settings.max_child_depth})")
            if run is not None and self.workflows is not None:
                child = self.workflows[step.child]
                try:
                    child.slot_of(child.stored_input(step_input(run, step)))
                except ValueError as exc:
                    return f"step {step.name!r}: its child run's input: {exc}"
            return None
        if self.has_action is None or self.has_action(step.agent, step.action) is not False:
            return None
        return (f"step {step.name!r}: agent action '{step.agent}.{step.action}' is not in the deployed code "
                "(removed or renamed since the run started)")

    def _refuse(self, tx: Tx, run: RunRow, step: StepRow, reason: str, moves: Moves, *, undo: bool = True) -> None:
        """``step`` cannot start or go on: it fails with ``reason`` and one alert, and the run is
        undone (or, without ``undo``, left in error for an operator)."""
        failed = tx.steps.refuse_step(step, reason, instance_id())
        if failed is not None:
            log.error("run %s: %s", run.id, reason)
            self._fail_run(tx, run, failed, reason, moves, undo=undo)

    def _fail_run(self, tx: Tx, run: RunRow, failed: StepRow, reason: str, moves: Moves, *,
                  undo: bool = True) -> None:
        """``failed`` failed for good: its alert, the run undone (or in error), and its undo started."""
        moves.alerts.append(fail_run(tx, self.alerts, self.settings, run, failed, reason, actor=instance_id(),
                                     undo=undo))
        after = tx.runs.lock_run(run.id)
        if after is not None:
            self._plan(tx, after, moves)
