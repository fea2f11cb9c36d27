"""Durable polling on real worker processes: between its calls a polling step lives only in the
store, so every worker and beat may die and come back between polls; and a job that is never done
fails its step at max_wait, with one alert, and the run is undone."""

from __future__ import annotations

from functools import partial
from itertools import pairwise
from pathlib import Path

import pytest
from sqlalchemy import select

from sas_app.store.tables import alerts
from tests.integration.graph_app import calls
from tests.integration.test_graph import APP, start
from tests.support import wait_for

pytestmark = pytest.mark.integration


def test_a_job_done_after_five_polls_with_every_worker_killed_and_restarted_between_polls(stack, app, stack_env):
    start(stack, ("agents", 1))
    handle = app.submit("rendering", {"polls": 5, "every": 2}, business_key="render-1")
    def answered(polls: int) -> bool:
        render = handle.status().step("render")
        return render.polls == polls and render.state == "pending"

    for polls in range(1, 6):
        wait_for(partial(answered, polls), 30, f"poll {polls} to be answered 'not yet'")
        for name in ("scheduler", "agents", "beat"):  # nothing of the waiting step lives in a process
            stack.restart(name, env=APP)
        stack.wait_ready()

    view = handle.wait(60)
    assert view.process_state == "processed", view.run.error
    render = view.step("render")
    assert (render.polls, render.failure_count, render.result) == (5, 0, {"rendered": render.idempotency_key,
                                                                           "checks": 5})
    made = [c for c in calls(Path(stack_env["SAS_HOME"])) if c["what"] == "render"]
    assert {c["key"] for c in made} == {render.idempotency_key}  # one key for every call
    assert [(c["attempt"], c["poll"]) for c in made] == [(n + 1, n) for n in range(6)]
    pids = [c["pid"] for c in made]
    assert all(a != b for a, b in pairwise(pids)), f"each poll ran in a worker started after the last: {pids}"


def test_a_job_never_done_fails_at_max_wait_with_one_alert_and_the_run_is_undone(stack, app, stack_env):
    start(stack, ("agents", 1))
    handle = app.submit("rendering_briefly", {"polls": 1000, "every": 0.5}, business_key="render-2")

    view = handle.wait(30)

    assert view.process_state == "compensated"
    render = view.step("render")
    assert render.state == "failed" and "its job was not done 3 s after its first 'not yet' (max_wait)" in render.error
    gave_up = next(e.at for e in view.events if e.position == render.position and e.to_state == "failed")
    first_not_yet = next(e.at for e in view.events if e.position == render.position and e.to_state == "pending")
    assert gave_up - first_not_yet >= 3.0
    home = Path(stack_env["SAS_HOME"])
    assert sum(1 for c in calls(home) if c["key"] == view.step("first").idempotency_key + ":undo") == 1
    with app.store.engine.connect() as conn:
        assert conn.execute(select(alerts.c.kind).where(alerts.c.run_id == handle.id)).scalars().all() == ["failed"]
