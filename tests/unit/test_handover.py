"""What an agent's worker takes of the steps that follow the one it completed: one at a time, its
own agent's only, while its timeout ends before the message's soft time limit, up to its count."""

from __future__ import annotations

import pytest

from sas_app.agents.handover import Handover
from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import AgentMessage
from sas_app.settings import Settings


def step(agent: str = "svc", action: str = "work", timeout: float = 3.0, position: int = 1) -> AgentMessage:
    return AgentMessage(agent, action, "r1", position, 1, timeout, 0, {}, Publish.DISPATCH)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_it_takes_one_step_of_its_own_agent_until_that_one_is_run():
    handover = Handover("svc", {"work"}, Clock(), ends=None, left=8)
    assert not handover(step(agent="mail")) and not handover(step(action="other"))
    assert handover(step(position=1))
    assert not handover(step(position=2))  # a fan-out's second branch goes to the broker
    assert handover.next() == step(position=1) and handover.next() is None
    assert handover(step(position=2))


def test_it_takes_no_more_than_its_count():
    handover = Handover("svc", {"work"}, Clock(), ends=None, left=2)
    for position in (1, 2):
        assert handover(step(position=position)) and handover.next() is not None
    assert not handover(step(position=3))


def test_a_step_is_taken_only_while_its_timeout_ends_before_the_soft_time_limit():
    clock = Clock()
    handover = Handover("svc", {"work"}, clock, ends=clock.now + 4.0, left=8)  # a 3 s step's message
    assert not handover(step(timeout=4.0))
    assert handover(step(timeout=3.0)) and handover.next() is not None
    clock.now += 1.5
    assert not handover(step(timeout=3.0))  # it would end at 104.5, past the limit at 104


def test_sas_eager_steps_is_a_count_or_zero():
    assert Settings.from_env({"SAS_EAGER_STEPS": "0"}).eager_steps == 0
    assert Settings.from_env({}).eager_steps == 8
    with pytest.raises(ValueError, match=r"eager_steps must be 0 \(off\) or more steps, got -1"):
        Settings.from_env({"SAS_EAGER_STEPS": "-1"})
