"""A scale-down, as Kubernetes does it: SIGTERM to an agent worker's main process (the container's
PID 1) while it holds steps, a new pod already consuming, and SIGKILL only after the grace period
``sas kubernetes`` gives it (the agent's longest step plus a margin). The draining worker takes
nothing more and finishes every step it holds (with prefetch 1 it holds none it has not started),
replying before it exits; the new worker takes the rest: one attempt per step, one request per
charge. (A worker killed before its steps end — SIGKILL at the grace period — is the lost worker
of ``tests/integration/test_orders.py``: each of its steps retried once.)"""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest
from sqlalchemy import select

from sas_app.interfaces.manifests import DRAIN_MARGIN
from sas_app.states import EventKind, StepState
from sas_app.store.tables import events
from tests.integration.conftest import shop_app
from tests.support import wait_for

pytestmark = pytest.mark.integration

CHARGE_TIMEOUT = 10.0
LATENCY = 1.5


@pytest.mark.both_brokers
def test_an_agent_worker_sent_sigterm_mid_steps_finishes_them_and_nothing_runs_twice(stack, stack_env):
    shop = shop_app(stack_env, charge_timeout=CHARGE_TIMEOUT)
    shop.migrate()
    stack.services()
    stack.scheduler(wait=False)
    stack.agents("old", concurrency=3, wait=False)
    stack.beat(wait=False)
    stack.wait_ready()
    handles = [shop.submit("order", {"amount": 5 + i, "faults": {"charge": f"latency:{LATENCY}"}},
                           business_key=f"drain-{i}") for i in range(8)]
    charging = lambda: [k for k in stack.requests_seen() if k.endswith(":charge_payment")]  # noqa: E731
    wait_for(lambda: len(charging()) >= 3, 30, "three charges under way, one in each of its processes")

    stack.signal("old", signal.SIGTERM, group=False)  # the kubelet's SIGTERM: to the main process only
    stopped_at = time.monotonic()
    stack.agents("new", concurrency=3)
    old = stack.procs["old"]
    grace = CHARGE_TIMEOUT + DRAIN_MARGIN
    wait_for(lambda: old.poll() is not None, grace, "the draining worker to exit within its grace period")
    drained_in = time.monotonic() - stopped_at

    views = [h.wait(60) for h in handles]
    assert [v.process_state for v in views] == ["processed"] * len(handles)
    with shop.store.engine.connect() as conn:
        dispatches = Counter(conn.execute(
            select(events.c.run_id, events.c.position)
            .where(events.c.kind == EventKind.TRANSITION.value, events.c.to_state == StepState.RUNNING.value,
                   events.c.position.is_not(None))).all())
    assert set(dispatches.values()) == {1}, f"steps dispatched more than once: {dispatches.most_common(3)}"
    assert all(v.step("charge_payment").attempt == 1 and v.step("charge_payment").failure_count == 0 for v in views)
    seen = stack.requests_seen()
    assert {seen[f"{h.id}:charge_payment"] for h in handles} == {1}  # no charge asked for twice
    assert len(stack.ledger("payment")) == len(handles)
    assert old.returncode == 0 and drained_in < LATENCY + DRAIN_MARGIN, (old.returncode, drained_in)
    shop.store.dispose()
