"""The harness that starts workers, beat and servers for the demo, the benches and the chaos run:
whatever ends a run, it leaves no process of its own behind."""

from __future__ import annotations

import sys
import threading

import pytest

from sas_app.processes import Processes, Stopped
from tests.support import live_processes_with, wait_for

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_a_restart_asked_after_stop_all_is_refused_and_nothing_is_left_running(tmp_path):
    marker = f"SAS_TEST_HARNESS={tmp_path}"
    procs = Processes(tmp_path, {"SAS_TEST_HARNESS": str(tmp_path)})
    procs.start("worker", SLEEPER)
    procs.start("beat", SLEEPER)
    wait_for(lambda: len(live_processes_with(marker)) == 2, 10, "both processes to run")
    stopped = threading.Event()
    refused: list[BaseException] = []

    def restart_when_gone() -> None:  # what a chaos run's warm shutdown does, in a thread of its own
        stopped.wait(10)
        for action in (lambda: procs.start("worker", wait=False), lambda: procs.kill("beat")):
            try:
                action()
            except Stopped as exc:
                refused.append(exc)

    thread = threading.Thread(target=restart_when_gone)
    thread.start()
    procs.stop_all(grace=0)
    stopped.set()
    thread.join(10)

    assert [str(e) for e in refused] == ["not starting worker: every process here has been stopped",
                                         "not signalling beat: every process here has been stopped"]
    wait_for(lambda: live_processes_with(marker) == [], 10, "every process to be gone")
    with pytest.raises(Stopped):
        procs.start("beat")


def test_starting_a_name_still_running_replaces_it_instead_of_orphaning_it(tmp_path):
    """A chaos run's warm shutdown restarts its worker once the worker is gone; a kill meanwhile
    restarts it too. Two starts of one name must leave one process, the later one."""
    marker = f"SAS_TEST_HARNESS={tmp_path}"
    procs = Processes(tmp_path, {"SAS_TEST_HARNESS": str(tmp_path)})
    try:
        procs.start("worker", SLEEPER)
        first = procs.procs["worker"].pid
        procs.start("worker", wait=False)
        second = procs.procs["worker"].pid

        wait_for(lambda: live_processes_with(marker) == [second], 10, "only the second process to be left")
        assert first != second
    finally:
        procs.stop_all(grace=0)
    assert live_processes_with(marker) == []
