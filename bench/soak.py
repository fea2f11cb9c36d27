"""What a long chaos run (a soak) watches over time, and how it is judged.

Every ``interval`` seconds :class:`Watch` samples the resident memory of each process of the run
(each worker's main process and pool children, beat, the services, the submitting process) and
the database connections the stack holds open. Afterwards :func:`judge` compares the last
``window`` with the first:

* **memory flat**: each process of the stack that lived through both windows (a process restarted
  by a fault starts a new life and is judged on its own) averages at most 10% more in the last
  window (the run's own submitting process is reported beside them, not judged: it keeps every
  order's bookkeeping);
* **no connection growth**: the most connections open in the last window is no more than in the
  first (give or take one pool's worth of slack, :data:`CONNECTION_SLACK`).

Neither can be judged on a run shorter than two windows: the verdict is then None, not a pass.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from statistics import mean
from typing import Any

from bench.cpu import children

#: at most this much more memory in the last window than in the first
MEMORY_GROWTH = 0.10
#: the run's own process: its children are the run's processes, not a pool of its own; its memory
#: is reported, not judged (see :func:`judge`)
HARNESS = "driver"
#: a connection count is noisy by a pool's few connections (a fault's reconnects)
CONNECTION_SLACK = 4


def rss_kb(pid: int) -> int | None:
    """Resident memory of one process, in kB; None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def parse_duration(text: str) -> float:
    """``30m``, ``90s``, ``1h`` or seconds, as seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    text = text.strip().lower()
    try:
        seconds = float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (30m, 90s, 1h or seconds)") from None
    if seconds <= 0:
        raise ValueError(f"a soak must last more than 0 s, got {text!r}")
    return seconds


class Watch:
    """Samples, in a thread of its own, until :meth:`stop`.

    ``processes`` gives the run's processes now, by name (a worker's pool children are added as
    ``<name>/pool``); ``connections`` the stack's open database connections (None when the
    database does not answer)."""

    def __init__(self, processes: Callable[[], Iterable[tuple[str, int]]], connections: Callable[[], int | None],
                 interval: float = 10.0) -> None:
        self.processes = processes
        self.connections = connections
        self.interval = interval
        self.started = time.monotonic()
        self.memory: dict[str, list[tuple[float, int]]] = {}  # "<name> <pid>" -> (t, kB)
        self.open_connections: list[tuple[float, int]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="soak-watch", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)

    def sample(self) -> None:
        t = round(time.monotonic() - self.started, 1)
        for name, pid in self.processes():
            pool = [] if name == HARNESS else [(f"{name}/pool", child) for child in children(pid)]
            for label, each in [(name, pid), *pool]:
                kb = rss_kb(each)
                if kb is not None:
                    self.memory.setdefault(f"{label} {each}", []).append((t, kb))
        try:
            count = self.connections()
        except Exception:  # the database restarting: no sample this time
            count = None
        if count is not None:
            self.open_connections.append((t, count))

    def _run(self) -> None:
        while not self.done.wait(self.interval):
            self.sample()


def judge(watch: Watch, window: float) -> dict[str, Any]:
    """The memory and connection verdicts over the first and last ``window`` seconds sampled."""
    samples = [t for series in watch.memory.values() for t, _ in series] + [t for t, _ in watch.open_connections]
    if not samples or max(samples) - min(samples) < 2 * window:
        return {"window_s": window, "memory_flat": None, "connections_flat": None,
                "why": f"ran {max(samples, default=0):.0f} s: too short to compare two {window:.0f} s windows"}
    first_end, last_start = min(samples) + window, max(samples) - window
    growth: dict[str, float] = {}
    for key, series in watch.memory.items():
        early = [kb for t, kb in series if t <= first_end]
        late = [kb for t, kb in series if t >= last_start]
        if early and late:
            growth[key] = round(mean(late) / mean(early) - 1, 3)
    early_conns = [n for t, n in watch.open_connections if t <= first_end]
    late_conns = [n for t, n in watch.open_connections if t >= last_start]
    harness = {key: g for key, g in growth.items() if key.split()[0] == HARNESS}
    growth = {key: g for key, g in growth.items() if key not in harness}
    grown = {key: g for key, g in growth.items() if g > MEMORY_GROWTH}
    return {
        "window_s": window,
        # the run's own submitting process keeps every order's bookkeeping (its run id, its items,
        # its reviews, the faults' timeline) to judge the run by: it grows with the orders by design
        "harness_growth": harness,
        "processes_judged": len(growth),
        "memory_growth": dict(sorted(growth.items(), key=lambda kv: -kv[1])[:20]),
        "memory_grown": grown,
        "memory_flat": not grown if growth else None,
        "connections_first_max": max(early_conns, default=None),
        "connections_last_max": max(late_conns, default=None),
        "connections_flat": (max(late_conns) <= max(early_conns) + CONNECTION_SLACK
                             if early_conns and late_conns else None),
    }


def own_pid() -> tuple[str, int]:
    """This process, the run's harness (it submits the orders and judges the run)."""
    return HARNESS, os.getpid()
