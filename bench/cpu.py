"""Where the CPU goes during a bench run, per component, read from /proc (no profiler attached):
the CPU time of each component's processes, sampled before and after the load, divided by the
steps it ran. A process that exits in between is counted through its parent, where the parent is
of the same component (a database server's backends, which end with their client's connection);
otherwise it loses its share (worker pools live through a run)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")

#: what a component is: the ids of its processes now
Pids = Callable[[], Iterable[int]]


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command's name (the state is the first, the
    stat's third); none once the process has gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return []


def cpu_seconds(pid: int) -> float:
    """Seconds one process has run on a CPU, its live threads included: the scheduler's count in
    nanoseconds (``/proc/<pid>/task/*/schedstat``), where user + system time (``stat``) counts
    whole 10 ms clock ticks of each process, and a database backend that ran 9 ms reads 0. Where
    the kernel keeps no schedstat, ``stat``'s ticks. 0 once the process has gone."""
    try:
        threads = [int((task / "schedstat").read_text().split()[0]) for task in Path(f"/proc/{pid}/task").iterdir()]
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0.0
    if any(threads):
        return sum(threads) / 1e9
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICK if fields else 0.0  # utime, stime: stat's 14th and 15th


def reaped_seconds(pid: int) -> float:
    """Seconds the children of ``pid`` that have exited and that it has waited for ran on a CPU,
    theirs included (``stat``'s cutime and cstime: whole clock ticks in all). 0 once ``pid`` has gone."""
    fields = _stat(pid)
    return (int(fields[13]) + int(fields[14])) / TICK if fields else 0.0  # cutime, cstime: stat's 16th and 17th


def parent(pid: int) -> int:
    """The id of ``pid``'s parent (``stat``'s fourth field); 0 once it has gone."""
    fields = _stat(pid)
    return int(fields[1]) if fields else 0


def started(pid: int) -> str:
    """When ``pid`` started (``stat``'s 22nd field, in clock ticks since boot): with the id, it
    names one process even if the id is used again. Empty once the process has gone."""
    fields = _stat(pid)
    return fields[19] if fields else ""


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
    total from another, what it had run before the start would be taken off the others' share.

    Except in the components named in ``reaping``, whose processes' children are of the component
    too (a database server's, whose backends are its postmaster's children): there what a child
    ran until it exited is read from its parent's count of the children it reaped, less what it
    had run before the start. Without it, a client that opens and closes connections would take
    the work of its backends out of the database's figure. A process there whose parent is not
    one of the component's loses its share, as elsewhere."""

    def __init__(self, parts: dict[str, Pids], reaping: Iterable[str] = ()) -> None:
        self.parts = {**parts, "submitter": lambda: [os.getpid()]}
        self.reaping = set(reaping)
        self.before: dict[str, dict[tuple[int, str], tuple[float, float, tuple[int, str]]]] = {}

    def _sample(self) -> dict[str, dict[tuple[int, str], tuple[float, float, tuple[int, str]]]]:
        """Each component's processes: their CPU, the CPU of the children they reaped (only in
        the components reaping) and their parent, each process named by its id and start."""
        def reading(pid: int, reaping: bool) -> tuple[float, float, tuple[int, str]]:
            ppid = parent(pid)
            return cpu_seconds(pid), reaped_seconds(pid) if reaping else 0.0, (ppid, started(ppid))

        return {name: {(pid, started(pid)): reading(pid, name in self.reaping) for pid in pids()}
                for name, pids in self.parts.items()}

    def start(self) -> None:
        self.before = self._sample()

    def per_step(self, steps: int) -> dict[str, float]:
        """Milliseconds of CPU per step of each component since :meth:`start`, and their total,
        as flat ``cpu_<component>_ms`` figures."""
        after = self._sample()
        spent = {}
        for name, processes in after.items():
            before = self.before.get(name, {})
            seconds = sum(max(ran - before[key][0] if key in before else ran, 0.0)
                          for key, (ran, _, _) in processes.items())
            if name in self.reaping:
                both = processes.keys() & before.keys()
                seconds += sum(processes[key][1] - before[key][1] for key in both)
                # an exited process's whole CPU is in its parent's count now, if its parent is one of
                # these: take off what it had run before the start
                seconds -= sum(ran for key, (ran, _, up) in before.items() if key not in processes and up in both)
            spent[name] = max(seconds, 0.0)
        figures = {f"cpu_{name}_ms": 1000 * seconds / steps for name, seconds in spent.items()}
        figures["cpu_total_ms"] = 1000 * sum(spent.values()) / steps
        return figures
