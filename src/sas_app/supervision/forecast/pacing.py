"""Retries paced to their queue: how long the retry of each step that expired in a backlog waits,
so that a backlog is not made deeper by retries that would only expire in it again (a retry storm).

The retries of one agent join its queue one after another at the agent's pace, behind the retries
already waiting their turn, each sent no sooner than the queue ahead of it will have drained to
half a step's timeout (:func:`~sas_app.supervision.forecast.queue_model.clear_at` says when a
message sent now would be taken).

Expired in a backlog means its message still waits in its agent's queue (it is among the last
dispatched the queue's depth counts), or the queue is so deep that a message sent now would be
taken past half the step's timeout (its message was dropped unworked, or its worker died with it: a
retry sent now would expire again all the same), or the agent's paced retries still wait their turn
(one sent now would jump the line they keep, and the steps behind it take more attempts). It goes
by the queue, not by the at-risk alerts: those come only in a step's last fifth, and a step whose
message was dropped before a look warned of it went straight back into the backlog. With no message
waiting, an agent's expired steps keep their back-off alone: with no backlog seen, its pace may be
how often work comes to it, not how fast it can go.
"""

from __future__ import annotations

import logging

from sas_app.messaging.routing import agent_queue
from sas_app.store import StepRow, Tx
from sas_app.supervision.forecast.queue_model import clear_at, pace
from sas_app.supervision.queue_depths import queued_steps

log = logging.getLogger(__name__)


def paced_retries(tx: Tx, expired: list[StepRow], depths: dict[str, int], window: float) -> dict[int, float]:
    """How long the retry of each of ``expired`` that expired in a backlog waits, by step id;
    ``depths``: the messages waiting in each busy agent's queue; ``window``: the seconds of recent
    completions an agent's pace is measured on."""
    by_agent: dict[str, list[StepRow]] = {}
    for step in expired:
        # an undo is sent ahead of the queue: nothing to wait behind
        if step.failure_count + 1 < step.max_failures and not step.is_undo:
            by_agent.setdefault(step.agent, []).append(step)
    waits: dict[int, float] = {}
    now = tx.now()
    for agent, candidates in by_agent.items():
        depth = depths.get(agent, 0)
        queued, behind = queued_steps(tx, agent, depth)
        if not queued:
            continue
        per_second = pace(*tx.sweep.recent_completions(agent, window))
        if per_second <= 0:  # no pace to go by: the back-off alone
            continue
        clear = clear_at(queued, now, per_second, behind) or now
        last_due = tx.sweep.paced_retries_due_last(agent)
        waiting = {step.id for step in queued}
        # its message waits; a message sent now would wait too long; or retries wait their turn
        group = [step for step in candidates
                 if step.id in waiting or clear - now > step.timeout / 2 or last_due is not None]
        if not group:
            continue
        half = min(step.timeout for step in group) / 2
        for i, step in enumerate(group):
            after = last_due + (i + 1) / per_second if last_due is not None else now
            waits[step.id] = max(clear + i / per_second - half, after) - now
        log.warning("%s: %d message(s) wait, a message sent now would be taken in %.0fs (%.1f a second): "
                    "%d retries paced, the last in %.0fs", agent_queue(agent), depth, clear - now, per_second,
                    len(group), waits[group[-1].id])
    return waits
