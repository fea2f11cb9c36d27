"""The chaos run, CI-sized: the same scenarios as ``python -m bench.chaos`` (its own Redis and
PostgreSQL, every kind of kill, restart and fault at least once) on fewer orders, so that a
regression in any recovery path fails CI. The figures themselves belong to bench/results."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.chaos import KINDS
from tests.integration.stack import REPO
from tests.support import live_processes_with, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.integration]


@pytest.mark.timeout(480)
def test_nothing_is_lost_or_applied_twice_while_every_process_and_server_is_killed(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--orders", "40", "--rate", "2", "--each", "1", "--seed", "7",
         "--max-failures", "4", "--bound", "150", "--out", str(tmp_path), "--home", str(tmp_path / "home"),
         "--keep"],
        cwd=REPO, capture_output=True, text=True, timeout=450, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    story = done.stdout[-3000:] + done.stderr[-3000:]
    written = list(tmp_path.glob("chaos-*.json"))
    assert len(written) == 1, story
    result = json.loads(written[0].read_text())

    assert done.returncode == 0, story
    assert all(result["faults_injected"].get(kind, 0) >= 1 for kind in KINDS), result["timeline"]
    assert (result["lost"], result["effects_applied_twice"], result["effects_left_standing"],
            result["not_terminal_within_bound"], result["secrets_in_logs"]) == (0, 0, 0, 0, 0), story
    assert result["submitted"] == 41 and result["submit_gave_up"] == []
    # nothing of the run left running: not a worker restarted by a fault's thread after the run
    # ended, not a server of its own
    wait_for(lambda: live_processes_with(str(tmp_path / "home")) + live_processes_with(result["postgres_dir"]) == [],
             10, "every process of the run to be gone")
    assert result["processed"] >= 28, story
    held = result["held_orders"]
    assert held["held"] >= 5 and held["wrong"] == [], held
    assert held["outcomes"].get("consumed", 0) >= 2 and held["outcomes"].get("timed out", 0) >= 1, held
    # the poison order: one worker per attempt up to its threshold, then undone, never a loop
    assert result["poison"] == [{"key": "poison-0", "state": "compensated", "charge_attempts": 4}]
    assert result["agent_children_lost"] <= 4 + 2, "only the poison step and kill_after_call kill pool children"
    # both recovery paths ran: the Supervisor's (an expired complete-by) and a lost worker's report
    assert {"expired", "worker_lost"} <= set(result["recovery_s"]["by_cause"])
