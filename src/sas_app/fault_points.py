"""Fault points: named places at commit boundaries where tests and chaos runs make a process fail.

Armed only through ``SAS_FAULTS`` (``name=action[,name=action…]``) at process start; with nothing
armed, :func:`hit` is one falsy check. Actions:

``kill``
    SIGKILL this process, as if the machine lost power.
``exit``
    ``os._exit(1)`` without cleanup.
``sleep:SECONDS``
    stall here (a process paused mid-step).
``raise``
    raise :class:`FaultInjected`.

Appending ``@once`` fires the point only the first time across all processes that share
``SAS_HOME`` (a marker file is created exclusively), so a restarted worker carries on.

Points: ``agent.before_call`` (complete-by checked, remote call not yet made: a pause here is
a zombie that wakes up late; ``agent.before_call.<step>`` arms it for one step only),
``agent.after_call`` (remote call returned, reply not sent), ``scheduler.after_commit``
(step marked running, agent message not sent), ``supervisor.after_commit`` (recovery committed,
Scheduler not asked), ``submit.after_commit`` (run written, Scheduler not asked).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

POINTS = frozenset(
    {
        "agent.before_call",
        "agent.after_call",
        "scheduler.after_commit",
        "supervisor.after_commit",
        "submit.after_commit",
    }
)


class FaultInjected(RuntimeError):
    """Raised by a fault point armed with ``raise``."""


_armed: dict[str, str] = {}
_marker_dir: Path | None = None


def arm(spec: str, marker_dir: Path | None = None) -> None:
    """Arm the points named in ``spec`` (replacing any armed before)."""
    global _marker_dir
    parsed: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, action = item.partition("=")
        if not sep or (name not in POINTS and not name.startswith("agent.before_call.")):
            raise ValueError(f"SAS_FAULTS: unknown fault point in {item!r}; known: {sorted(POINTS)}")
        parsed[name] = action
    _armed.clear()
    _armed.update(parsed)
    _marker_dir = marker_dir


def hit(name: str, step: str | None = None) -> None:
    """Fail here if ``name`` (or ``name.<step>``) is armed."""
    if not _armed:
        return
    if step is not None and f"{name}.{step}" in _armed:
        name = f"{name}.{step}"
    action = _armed.get(name)
    if action is None:
        return
    action, once, _ = action.partition("@once")
    if once and not _first_time(name):
        return
    kind, _, arg = action.partition(":")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "exit":
        os._exit(1)
    elif kind == "sleep":
        time.sleep(float(arg))
    elif kind == "raise":
        raise FaultInjected(name)


def _first_time(name: str) -> bool:
    folder = _marker_dir or Path(os.environ.get("SAS_HOME", ".sas"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(folder / f"fault-{name}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
