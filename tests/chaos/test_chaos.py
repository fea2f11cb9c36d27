"""The chaos run, CI-sized: the same scenarios as ``python -m bench.chaos`` (its own Redis and
PostgreSQL, every kind of kill, restart and fault at least once) on fewer orders, so that a
regression in any recovery path fails CI. The figures themselves belong to bench/results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.integration.stack import CHECKOUT_PATH, REPO
from tests.support import live_processes_with, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.integration]


@pytest.mark.timeout(480)
def test_nothing_is_lost_or_applied_twice_while_every_process_and_server_is_killed(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "bench.chaos", "--orders", "40", "--rate", "2", "--each", "1", "--seed", "7",
         "--max-failures", "4", "--bound", "150", "--out", str(tmp_path), "--home", str(tmp_path / "home"),
         "--keep"],
        cwd=REPO, capture_output=True, text=True, timeout=450, env={**os.environ, "PYTHONPATH": CHECKOUT_PATH},
    )
    story = done.stdout[-3000:] + done.stderr[-3000:]
    written = list(tmp_path.glob("chaos-*.json"))
    assert len(written) == 1, story
    result = json.loads(written[0].read_text())

    assert done.returncode == 0, story
    assert all(result["faults_injected"].get(kind, 0) >= 1 for kind in result["fault_kinds"]), result["timeline"]
    assert (result["lost"], result["effects_applied_twice"], result["effects_left_standing"],
            result["not_terminal_within_bound"], result["secrets_in_logs"]) == (0, 0, 0, 0, 0), story
    # overlapping sweeps, two Supervisors, redelivered replies: each attempt ends once
    assert result["attempts_moved_twice"] == [], result["attempts_moved_twice"]
    assert result["submitted"] == 41 + result["operators"]["submitted"] and result["submit_gave_up"] == []
    # the operators' orders: a paused one whose resume's message was lost still ends (the path is
    # pinned down by tests/integration/test_failures.py; here a step of its own may move it on), the
    # order made to end in error is undone (resubmitted from error, unless the faults undid it
    # first), a cancelled one ends cancelled; no run was ever left with nothing due
    outcomes = result["operators"]["outcomes"]
    assert sum(n for what, n in outcomes.items() if what.startswith("operator_resubmit")
               and what.endswith("-> compensated")) == 1, outcomes
    assert outcomes.get("operator_cancel -> cancelled") == 1, outcomes
    assert sum(n for what, n in outcomes.items() if what.startswith("operator_pause ->")) == 1, outcomes
    assert result["stranded_runs"] == 0
    # the orders that asked to be told how they end were told: nothing left in the outbox
    assert result["notifications"] >= 3 and result["outbox_unsent"] == 0
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
    # the Supervisor recovered expired attempts. A lost worker's report may or may not be the path
    # this time: sent while the broker is down or the Scheduler is being restarted, it is refused and
    # the Supervisor finds the attempt at its complete-by instead (test_failures' poison test pins
    # the report path down)
    assert "expired" in result["recovery_s"]["by_cause"]


@pytest.mark.timeout(240)
def test_a_chaos_run_stopped_with_ctrl_c_leaves_no_process_behind(tmp_path):
    """Ctrl-C in the middle of the faults (a worker or a server being restarted by a fault's
    thread, say): the run stops every process and server it started, and says where its logs are."""
    home, mark = tmp_path / "home", f"SAS_CHAOS_TEST={tmp_path}"
    run = subprocess.Popen(
        [sys.executable, "-m", "bench.chaos", "--orders", "600", "--rate", "20", "--each", "4", "--seed", "3",
         "--out", str(tmp_path), "--home", str(home)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "PYTHONPATH": CHECKOUT_PATH, "SAS_CHAOS_TEST": str(tmp_path)},
    )
    try:
        # faults under way: a process of the run started a second time
        wait_for(lambda: any(log.read_text(errors="replace").count("--- start") >= 2
                             for log in (home / "logs").glob("*.log")) or run.poll() is not None,
                 150, "a fault to restart a process of the run")
        assert run.poll() is None, run.communicate()[0][-3000:]
        assert len(live_processes_with(mark)) >= 6  # the run, its workers, its Redis and PostgreSQL
        os.killpg(run.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        os.killpg(run.pid, signal.SIGINT)  # and a second one at once, as an impatient user (or a wrapper) sends
        output = run.communicate(timeout=90)[0]
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 130, output[-3000:]
    assert f"interrupted: every process of the run stopped; logs and state: {home}" in output
    wait_for(lambda: live_processes_with(mark) == [], 10, "every process of the run to be gone")
    assert not list(tmp_path.glob("chaos-*.json")), "an interrupted run judges nothing"
