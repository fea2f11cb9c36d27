"""The process harness: start the processes of a sas_app deployment — Celery workers and beat
(``sas worker``, ``sas beat``), and any other command such as the example's services — each in a
process group of its own, know when each is ready, signal, kill, restart and stop them.

The tests, ``sas demo`` and the benches all use it. Readiness comes from the process itself, not
from its log: a worker or beat writes its ``SAS_READY_FILE`` when Celery signals it is consuming
(``worker_ready``, ``beat_init``); a web service is ready when its URL answers.
"""

from __future__ import annotations

import os
import signal as signals
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: ``python -m sas_app.cli``: the ``sas`` command of the running interpreter
SAS = [sys.executable, "-m", "sas_app.cli"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], T], timeout: float, what: str, interval: float = 0.05,
               not_yet: tuple[type[BaseException], ...] = (Exception,)) -> T:
    """Call ``check`` until it returns something true, and return that; an exception of a type in
    ``not_yet`` counts as not yet (a server still starting). ``TimeoutError`` naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if value:
                return value
        except not_yet:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


@contextmanager
def stopped_by_signals() -> Iterator[threading.Event]:
    """Within (the main thread's): the first Ctrl-C or SIGTERM raises ``KeyboardInterrupt``, so the
    caller's clean-up runs and stops the processes it started — Python's own SIGTERM ends the
    process with no clean-up, and its children live on (workers still consuming from the broker) —
    and any signal after it is ignored from that instant on, so that none can cut the clean-up
    short. The handlers before are back on the way out.

    The event yielded is set by that first signal. A long run waits on it rather than sleeping, and
    stops when it is set: Python runs a signal's handler wherever the main thread is, and where
    that is a weakref's callback or a library calling back into Python from C (psycopg2 decoding a
    server's message, say), the ``KeyboardInterrupt`` is printed and dropped, which would leave the
    run going with every signal ignored.

    ::

        procs = Processes(home, env)
        with stopped_by_signals() as asked:
            try:
                procs.worker("agents", "payment", 4)
                while not done():
                    if asked.wait(0.5):
                        raise KeyboardInterrupt
            finally:
                procs.stop_all()
    """
    asked = threading.Event()

    def interrupt(*_: object) -> None:
        for sig in (signals.SIGINT, signals.SIGTERM):
            signals.signal(sig, signals.SIG_IGN)
        asked.set()
        raise KeyboardInterrupt

    previous = {sig: signals.signal(sig, interrupt) for sig in (signals.SIGINT, signals.SIGTERM)}
    try:
        yield asked
    finally:
        for sig, handler in previous.items():
            signals.signal(sig, handler)


@contextmanager
def interrupts_ignored() -> Iterator[None]:
    """Ctrl-C and SIGTERM ignored meanwhile (in the main thread; elsewhere nothing changes): a
    clean-up they interrupted would leave processes behind."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signals.signal(sig, signals.SIG_IGN) for sig in (signals.SIGINT, signals.SIGTERM)} \
        if in_main else {}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signals.signal(sig, handler)


#: set by :class:`Processes` in the environment of each process it starts: its own pid
LIFELINE = "SAS_LIFELINE"
#: how often a process the harness started checks that the harness is still there (seconds)
LIFELINE_CHECK_S = 0.5
#: how long after asking itself to stop, its harness gone, such a process kills its process group
LIFELINE_GRACE_S = 10.0


def hold_lifeline(env: Mapping[str, str] = os.environ) -> None:
    """In a process :class:`Processes` started (``sas`` commands call this first): stop once the
    harness is gone. A harness killed outright (SIGKILL: a test's timeout, the OOM killer) cleans
    nothing up, and what it started, each in a session of its own, lived on — a demo hung on a broken
    message was killed by its test, and its services and beat were still running minutes later. A
    daemon thread watches this process's parent; once it is not the harness any more (the process was
    adopted), it asks this process to stop (SIGTERM: Celery's warm shutdown) and, if it has not
    after :data:`LIFELINE_GRACE_S`, kills its process group, pool children and all. A harness
    killed while this process was still starting is gone already: it stops at once."""
    harness = env.get(LIFELINE, "")
    if not harness.isdigit():  # not started by a harness
        return
    if os.getppid() != int(harness) and _alive(int(harness)):  # passed on, by a process the harness started
        return

    def watch() -> None:
        while os.getppid() == int(harness):
            time.sleep(LIFELINE_CHECK_S)
        os.kill(os.getpid(), signals.SIGTERM)
        time.sleep(LIFELINE_GRACE_S)
        os.killpg(os.getpgid(0), signals.SIGKILL)

    threading.Thread(target=watch, name="sas-lifeline", daemon=True).start()


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs: a harness killed and not yet reaped (a zombie) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc here (macOS): taken as running
        return True


def answers(url: str) -> bool:
    import httpx  # here: every ``sas`` command imports this module (hold_lifeline), few ask a URL

    try:
        return httpx.get(url, timeout=1).is_success
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class Ready:
    """How to know a process is ready: a file it writes (``SAS_READY_FILE``), or a URL answering."""

    file: bool = False
    url: str = ""


CELERY_READY = Ready(file=True)


class Stopped(RuntimeError):
    """A start asked of :class:`Processes` after :meth:`~Processes.stop_all`."""


class Processes:
    """Named processes, each in its own process group, with logs under ``home/logs``.

    ``env`` is the environment every process starts with (``os.environ`` plus it); ``start``'s
    ``env`` adds to it for one process and is remembered for its restarts. Thread-safe: once
    :meth:`stop_all` has begun, every start is refused (:class:`Stopped`), so that a thread still
    restarting a process (a chaos run's warm shutdown, say) cannot leave one behind."""

    def __init__(self, home: Path, env: Mapping[str, str], cwd: Path | None = None) -> None:
        self.home = home
        self.env = {**os.environ, **env}
        self.cwd = cwd or home
        self.logs = home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.argv: dict[str, list[str]] = {}
        self.ready: dict[str, Ready | None] = {}
        self.extra_env: dict[str, dict[str, str]] = {}
        self.lock = threading.RLock()
        self.stopped = False

    # -- starting ---------------------------------------------------------------------------------

    def start(self, name: str, argv: list[str] | None = None, *, ready: Ready | None = None,
              env: Mapping[str, str] | None = None, wait: bool = True, timeout: float = 60) -> None:
        """Start ``argv`` as ``name`` (again, with its last argv and env, if ``argv`` is None);
        unless ``wait`` is False, return once it is ready. A name is one process: one still
        running under it is killed first (two threads restarting it leave one, not an orphan).
        Raises :class:`Stopped` once :meth:`stop_all` has begun."""
        with self.lock:
            if self.stopped:
                raise Stopped(f"not starting {name}: every process here has been stopped")
            previous = self.procs.get(name)
            if previous is not None and previous.poll() is None:
                _send(previous, signals.SIGKILL)
                previous.wait(30)
            if argv is not None:
                self.argv[name], self.ready[name] = list(argv), ready
            if env is not None:
                self.extra_env[name] = dict(env)
            process_env = {**self.env, **self.extra_env.get(name, {}), LIFELINE: str(os.getpid())}
            ready = self.ready.get(name)
            if ready is not None and ready.file:
                marker = self.ready_file(name)
                marker.unlink(missing_ok=True)
                process_env["SAS_READY_FILE"] = str(marker)
            with open(self.logs / f"{name}.log", "ab") as log:
                log.write(f"--- start {time.strftime('%H:%M:%S')} {' '.join(self.argv[name])}\n".encode())
                self.procs[name] = subprocess.Popen(
                    self.argv[name], stdout=log, stderr=subprocess.STDOUT, env=process_env, cwd=self.cwd,
                    start_new_session=True,
                )
        if wait:
            self.wait_ready(name, timeout=timeout)

    def sas(self, name: str, *args: str, ready: Ready | None = CELERY_READY, env: Mapping[str, str] | None = None,
            wait: bool = True) -> None:
        """Start ``sas <args>`` as ``name``."""
        self.start(name, [*SAS, *args], ready=ready, env=env, wait=wait)

    def worker(self, name: str, queues: str, concurrency: int = 2, *, pool: str = "prefork",
               env: Mapping[str, str] | None = None, wait: bool = True) -> None:
        self.sas(name, "worker", "-Q", queues, "-c", str(concurrency), "-P", pool, "-n", f"{name}@%h", env=env,
                 wait=wait)

    def beat(self, name: str = "beat", *, env: Mapping[str, str] | None = None, wait: bool = True) -> None:
        self.sas(name, "beat", "--schedule", str(self.home / f"{name}-schedule"), env=env, wait=wait)

    def ready_file(self, name: str) -> Path:
        return self.logs / f"{name}.ready"

    def check_running(self, *names: str) -> None:
        """Raise ``RuntimeError`` (with its log's tail) if one of ``names`` has exited."""
        for name in names:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def is_ready(self, name: str) -> bool:
        """True once ``name`` is ready; raises ``RuntimeError`` (with its log's tail) if it exited."""
        self.check_running(name)
        ready = self.ready.get(name)
        if ready is None:
            return True
        if ready.file:
            return self.ready_file(name).exists()
        return answers(ready.url)

    def wait_ready(self, *names: str, timeout: float = 60) -> None:
        for name in names or tuple(self.procs):
            deadline = time.monotonic() + timeout
            while not self.is_ready(name):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} was not ready after {timeout:.0f}s:\n{self.tail(name)}")
                time.sleep(0.05)

    # -- signalling and stopping ----------------------------------------------------------------------

    def signal(self, name: str, sig: int, group: bool = True) -> None:
        """Send ``sig`` to ``name``'s process group (its pool children too), or its main process only
        (:class:`Stopped` once :meth:`stop_all` has run: there is nothing left to signal)."""
        _send(self._proc(name), sig, group)

    def kill(self, name: str, sig: int = signals.SIGKILL) -> None:
        """``sig`` (SIGKILL) to the whole group; wait for the main process to be gone."""
        proc = self._proc(name)
        _send(proc, signals.SIGCONT)
        _send(proc, sig)
        proc.wait(30)

    def _proc(self, name: str) -> subprocess.Popen[bytes]:
        with self.lock:
            if self.stopped and name not in self.procs:
                raise Stopped(f"not signalling {name}: every process here has been stopped")
            return self.procs[name]

    def restart(self, name: str, env: Mapping[str, str] | None = None, wait: bool = False) -> None:
        """SIGKILL ``name`` and start it again (with ``env`` added for this and later restarts)."""
        self.kill(name)
        self.start(name, env=env, wait=wait)

    def heal(self) -> list[str]:
        """Resume every paused process group and start again any process that is gone."""
        restarted = []
        with self.lock:
            for name, proc in list(self.procs.items()):
                self.signal(name, signals.SIGCONT)
                if proc.poll() is not None:
                    self.start(name, wait=False)
                    restarted.append(name)
        return restarted

    def stop_all(self, grace: float = 5.0) -> None:
        """SIGTERM every group (a warm shutdown), SIGKILL what is left after ``grace`` seconds (at
        once with 0). A Ctrl-C or SIGTERM meanwhile is ignored (:func:`interrupts_ignored`)."""
        with interrupts_ignored():
            with self.lock:
                self.stopped = True
                for name in self.procs:
                    self.signal(name, signals.SIGCONT)
                    self.signal(name, signals.SIGTERM if grace > 0 else signals.SIGKILL)
                deadline = time.monotonic() + grace
                for name, proc in self.procs.items():
                    try:
                        proc.wait(max(0.1, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        self.signal(name, signals.SIGKILL)
                        proc.wait(30)
                    self.signal(name, signals.SIGKILL)  # pool children that outlived their parent
                self.procs.clear()

    # -- logs -----------------------------------------------------------------------------------------

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def tail(self, name: str, lines: int = 40) -> str:
        path = self.logs / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _send(proc: subprocess.Popen[bytes], sig: int, group: bool = True) -> None:
    """``sig`` to ``proc``'s process group (or to it alone); nothing if it is gone."""
    try:
        os.killpg(proc.pid, sig) if group else os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass
