"""Scheduled starts on real beat processes: two beats over ten ticks start one run per tick, and a
beat stopped over three ticks starts each of them once when it is back (inside the catch-up
window). ``sas schedules`` lists the schedule with its next tick."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime

import pytest
from sqlalchemy import select

from sas_app import SasApp
from sas_app.store.tables import runs
from tests.integration.stack import SAS
from tests.support import wait_for

pytestmark = pytest.mark.integration

QUEUES = "sas.scheduler,sas.supervisor,sas.agent.work"


def env_for(cron: str) -> dict[str, str]:
    return {"SAS_APP": "tests.integration.graph_app:sas", "GRAPH_APP_SCHEDULE": cron}


def ticks(app: SasApp) -> list[float]:
    """The ticks the schedule started runs for, from their business keys, in order."""
    with app.store.engine.connect() as conn:
        keys = conn.execute(select(runs.c.business_key).where(runs.c.schedule == "ticking")).scalars().all()
    assert len(keys) == len(set(keys))
    return sorted(datetime.fromisoformat(k.split("@", 1)[1].replace("Z", "+00:00")).timestamp() for k in keys)


def test_two_beats_over_ten_ticks_start_one_run_per_tick(stack, app):
    env = env_for("* * * * * *")  # every second
    stack.worker("all", QUEUES, 4, env=env, wait=False)
    stack.beat("beat1", env=env, wait=False)
    stack.beat("beat2", env=env, wait=False)
    stack.wait_ready()
    wait_for(lambda: len(ticks(app)) >= 12, 40, "twelve ticks")
    stack.kill("beat1")
    stack.kill("beat2")
    seen = ticks(app)
    assert seen == [seen[0] + i for i in range(len(seen))], "one run for every second, none missed, none twice"
    wait_for(lambda: all(app.get_run(r.id).process_state == "processed" for r in app.store.list_runs(
        workflow="ticked", limit=100)), 30, "every run to end")


def test_a_beat_stopped_over_three_ticks_starts_each_once_when_back(stack, app):
    env = env_for("* * * * * */2")  # every two seconds
    stack.worker("all", QUEUES, 4, env=env, wait=False)
    stack.beat("beat", env=env)
    stack.wait_ready()
    wait_for(lambda: len(ticks(app)) >= 2, 30, "two ticks")
    stack.kill("beat")
    stopped = app.store.now()
    wait_for(lambda: app.store.now() > stopped + 7, 10, "three ticks to pass with no beat")
    assert ticks(app)[-1] <= stopped
    missed = [t for t in range(int(stopped) + 1, int(stopped) + 8) if t % 2 == 0]
    stack.beat("beat", env=env)
    wait_for(lambda: set(missed) <= set(ticks(app)), 20, "the missed ticks to start")
    seen = ticks(app)
    assert seen == [seen[0] + 2 * i for i in range(len(seen))], "each tick once, the missed ones included"

    listed = json.loads(subprocess.run([SAS, "schedules", "--json"], env={**stack.env, **env}, capture_output=True,
                                       text=True, check=True, timeout=60).stdout)
    [row] = listed
    assert (row["name"], row["workflow"], row["cron"], row["overlap"]) == ("ticking", "ticked", "* * * * * */2",
                                                                           "allow")
    assert row["next_tick"] > row["last_tick"] and row["next_tick"] % 2 == 0
