"""Where the CPU goes during a bench run, per component, read from /proc (no profiler attached):
the CPU time of each component's processes, sampled before and after the load, divided by the
steps it ran. A process that exits in between loses its share (worker pools, database
backends and the broker live through a run, so nothing that matters does)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")

#: what a component is: the ids of its processes now
Pids = Callable[[], Iterable[int]]


def cpu_seconds(pid: int) -> float:
    """Seconds one process has run on a CPU, its live threads included: the scheduler's count in
    nanoseconds (``/proc/<pid>/task/*/schedstat``), where user + system time (``stat``) counts
    whole 10 ms clock ticks of each process, and a database backend that ran 9 ms reads 0. Where
    the kernel keeps no schedstat, ``stat``'s ticks. 0 once the process has gone."""
    try:
        threads = [int((task / "schedstat").read_text().split()[0]) for task in Path(f"/proc/{pid}/task").iterdir()]
        if any(threads):
            return sum(threads) / 1e9
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime: fields 14 and 15 of stat


def started(pid: int) -> str:
    """When ``pid`` started (``/proc/<pid>/stat``'s start time, in clock ticks since boot): with
    the id, it names one process even if the id is used again. Empty once the process has gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return ""


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (a worker's pool processes)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def named(*names: str) -> Pids:
    """Every process whose command is one of ``names`` (a server's processes: postgres, redis-server, beam.smp)."""
    def pids() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if (entry / "comm").read_text().strip() in names:
                        found.append(int(entry.name))
                except (FileNotFoundError, ProcessLookupError):
                    continue
        return found
    return pids


def worker(pid: int) -> dict[str, Pids]:
    """A Celery worker as two components: its main process and its pool."""
    return {"main": lambda: [pid], "pool": lambda: children(pid)}


class CpuMeter:
    """``parts``: component name -> its processes; ``self`` (this process) is the submitter.

    Each process is counted from its own reading at :meth:`start` (or from nothing, if it started
    since). A process of the component that exits in between — a database backend of another
    client, an autovacuum worker — loses its share since the start, and no more: subtracting one
    total from another, what it had run before the start would be taken off the others' share."""

    def __init__(self, parts: dict[str, Pids]) -> None:
        self.parts = {**parts, "submitter": lambda: [os.getpid()]}
        self.before: dict[str, dict[tuple[int, str], float]] = {}

    def _sample(self) -> dict[str, dict[tuple[int, str], float]]:
        return {name: {(pid, started(pid)): cpu_seconds(pid) for pid in pids()} for name, pids in self.parts.items()}

    def start(self) -> None:
        self.before = self._sample()

    def per_step(self, steps: int) -> dict[str, float]:
        """Milliseconds of CPU per step of each component since :meth:`start`, and their total,
        as flat ``cpu_<component>_ms`` figures."""
        after = self._sample()
        spent = {name: sum(max(seconds - self.before.get(name, {}).get(key, 0.0), 0.0)
                           for key, seconds in processes.items())
                 for name, processes in after.items()}
        figures = {f"cpu_{name}_ms": 1000 * seconds / steps for name, seconds in spent.items()}
        figures["cpu_total_ms"] = 1000 * sum(spent.values()) / steps
        return figures
