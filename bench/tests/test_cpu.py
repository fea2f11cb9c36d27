"""The benches' CPU meter (bench/cpu.py): what it counts for a component whose processes come and go."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.cpu import CpuMeter, children, cpu_seconds

pytestmark = pytest.mark.bench

#: a process that spins for ARGV[1] seconds of CPU, says so, then waits for its input to close
SPIN = """
import sys, time
until = time.process_time() + float(sys.argv[1])
while time.process_time() < until:
    pass
print("spun", flush=True)
sys.stdin.read()
"""


def spinner(seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", SPIN, str(seconds)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "spun\n"
    return proc


@pytest.mark.parametrize("reaping", [[], ["component"]])
def test_a_process_that_exits_during_the_measurement_takes_nothing_from_the_others_share(reaping):
    """A database backend that worked before the measurement and ends during it (another client's,
    an autovacuum worker) must not be counted as negative work: the component's figure is what its
    other processes ran meanwhile. So too where the component counts its children through their
    parent, when the parent (here the test) is not one of its processes."""
    early = spinner(1.0)  # works before the meter starts, then exits during it
    procs = [early]
    try:
        meter = CpuMeter({"component": lambda: [p.pid for p in procs if p.poll() is None]}, reaping=reaping)
        meter.start()
        before_early = cpu_seconds(early.pid)
        assert before_early >= 0.9
        early.communicate("")
        procs.append(spinner(0.3))  # starts and works during the measurement
        spent_ms = meter.per_step(1)["cpu_component_ms"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.communicate("")
    # the second process's 0.3 s and its interpreter's start: nothing taken off for the first, and
    # none of what the first ran before the start counted either (that would be 1,300 ms and more)
    assert 250 <= spent_ms < 1000, spent_ms


#: a server that starts spinning children (``keep S``: one that stays; ``spin S``: one that ends)
#: and ends the kept ones (``release``), waiting for each that ends; it answers each line "done"
SERVER = f"""
import subprocess, sys
held = []
for line in sys.stdin:
    command, *seconds = line.split()
    if command == "release":
        for child in held:
            child.communicate("")
        held.clear()
    else:
        child = subprocess.Popen([sys.executable, "-c", {SPIN!r}, *seconds], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        child.stdout.readline()
        held.append(child) if command == "keep" else child.communicate("")
    print("done", flush=True)
"""


def test_a_servers_children_that_exit_during_the_measurement_are_counted_through_it():
    """A database server's backends end with their client's connection: a client that opens and
    closes connections must not take their work out of the server's figure, nor add what a backend
    ran before the measurement."""
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert server.stdin is not None and server.stdout is not None

    def say(line: str) -> None:
        server.stdin.write(line + "\n")
        server.stdin.flush()
        assert server.stdout.readline() == "done\n"

    try:
        say("keep 1.0")  # a backend that worked before the measurement, and ends during it
        meter = CpuMeter({"server": lambda: [server.pid, *children(server.pid)]}, reaping=["server"])
        meter.start()
        say("release")
        say("spin 0.3")  # one that starts, works and ends during it
        spent_ms = meter.per_step(1)["cpu_server_ms"]
    finally:
        server.communicate("")
    # the second child's 0.3 s and its interpreter's start; not the first's 1 s before the start
    assert 250 <= spent_ms < 1000, spent_ms
