"""The harness that starts workers, beat and servers for the demo, the benches and the chaos run:
whatever ends a run, it leaves no process of its own behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from sas_app.testing.processes import Processes, Stopped
from tests.support import live_processes_with, wait_for

pytestmark = pytest.mark.integration  # real processes

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


def test_a_bench_killed_with_sigterm_stops_what_it_started_first(tmp_path):
    """Found running the throughput bench: `pkill -f bench.throughput` ended its driver (Python's own
    SIGTERM runs no clean-up) and its workers went on consuming from Redis, taking the test suite's
    messages. Under stopped_by_signals a SIGTERM (and a second one right after it) runs the clean-up."""
    marker = f"SAS_TEST_HARNESS={tmp_path}"
    driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from sas_app.testing.processes import Processes, stopped_by_signals
        with stopped_by_signals():
            procs = Processes(Path({str(tmp_path)!r}), {{"SAS_TEST_HARNESS": {str(tmp_path)!r}}})
            try:
                procs.start("worker", {SLEEPER!r})
                print("started", flush=True)
                time.sleep(120)
            finally:
                procs.stop_all(grace=0)
        """)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with driver:
        try:
            assert driver.stdout is not None and driver.stdout.readline() == "started\n"
            wait_for(lambda: len(live_processes_with(marker)) == 1, 10, "the bench's worker to run")
            driver.send_signal(signal.SIGTERM)
            driver.send_signal(signal.SIGTERM)
            _, err = driver.communicate(timeout=20)
        finally:
            if driver.poll() is None:
                driver.kill()
    assert "KeyboardInterrupt" in err  # the clean-up ran, not Python's own end on SIGTERM
    wait_for(lambda: live_processes_with(marker) == [], 10, "the bench's worker to be gone")


#: a process that holds its lifeline, says whether it watches its harness, then stays
HOLDS_LIFELINE = [sys.executable, "-c", textwrap.dedent("""
    import threading, time
    from sas_app.testing.processes import hold_lifeline
    hold_lifeline()
    print(any(t.name == "sas-lifeline" for t in threading.enumerate()), flush=True)
    time.sleep(60)
""")]


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "not_yet_reaped"])
def test_a_process_whose_harness_was_killed_before_it_started_watching_stops_at_once(reaped):
    # the harness (a demo restarting a worker, say) killed while this process was still importing:
    # by the time it holds its lifeline it has been adopted, and its harness is gone — or a zombie
    # its own parent has not reaped yet
    gone = subprocess.Popen(SLEEPER)
    gone.kill()
    if reaped:
        gone.wait()
    else:
        wait_for(lambda: Path(f"/proc/{gone.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 10,
                 "the harness to be a zombie")
    try:
        done = subprocess.run(HOLDS_LIFELINE, env={**os.environ, "SAS_LIFELINE": str(gone.pid)},
                              capture_output=True, text=True, timeout=30)
    finally:
        gone.wait()
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr


def test_a_process_started_by_one_the_harness_started_leaves_the_watching_to_it():
    with subprocess.Popen(SLEEPER) as harness:  # alive, and not the parent of the process below
        try:
            with subprocess.Popen(HOLDS_LIFELINE, env={**os.environ, "SAS_LIFELINE": str(harness.pid)},
                                  stdout=subprocess.PIPE, text=True) as child:
                try:
                    assert child.stdout is not None and child.stdout.readline().strip() == "False"
                finally:
                    child.kill()
        finally:
            harness.kill()


def test_a_stop_is_seen_even_when_a_library_swallowed_its_keyboard_interrupt():
    """Found in CI: the chaos run's Ctrl-C reached psycopg2 decoding the message of a PostgreSQL the
    same Ctrl-C had stopped; psycopg2 printed the KeyboardInterrupt and carried on, and the run went
    on to its end with every signal ignored. The event stopped_by_signals yields says a stop was asked."""
    driver = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, signal, sys
        from sas_app.testing.processes import stopped_by_signals
        sys.unraisablehook = lambda u: print("swallowed", type(u.exc_value).__name__, flush=True)
        class Library:
            def __del__(self):  # a callback that cannot raise: Python runs the handler in it
                os.kill(os.getpid(), signal.SIGINT)
                sum(range(100_000))
        with stopped_by_signals() as asked:
            Library()
            print("stop asked" if asked.wait(5) else "stop lost", flush=True)
        """)], capture_output=True, text=True, timeout=30)
    assert driver.stdout.splitlines() == ["swallowed KeyboardInterrupt", "stop asked"], driver.stderr


def test_the_chaos_runs_servers_refuse_to_start_once_stopped(tmp_path):
    """A fault's thread restarting Redis or PostgreSQL as the run stops would leave a server behind."""
    from harness.servers import Servers

    (tmp_path / "logs").mkdir()
    servers = Servers(tmp_path)
    servers.start_redis()
    assert live_processes_with(str(tmp_path / "redis")) != []
    servers.stop()
    with pytest.raises(Stopped, match="Redis"):
        servers.start_redis()
    with pytest.raises(Stopped, match="PostgreSQL"):
        servers.start_postgres()
    wait_for(lambda: live_processes_with(str(tmp_path / "redis")) == [], 10, "the run's Redis to be gone")


def test_the_chaos_runs_proxy_drops_its_connections_and_refuses_new_ones_while_cut():
    """What partitions one worker from PostgreSQL: traffic flows, then every connection through it
    is dropped and new ones are refused until the cut is over."""
    import socket

    from harness.proxy import Proxy

    echo = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = echo.accept()
            except OSError:
                return
            threading.Thread(target=echo_back, args=(conn,), daemon=True).start()

    def echo_back(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(1024):
                    conn.sendall(data)
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    proxy = Proxy(echo.getsockname()[1])
    try:
        def talk(conn: socket.socket | None = None) -> bytes:
            """What comes back for a ping: nothing if the connection was closed or reset."""
            try:
                with conn or socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as c:
                    c.sendall(b"ping")
                    return c.recv(1024)
            except OSError:
                return b""

        assert talk() == b"ping"
        held = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        held.sendall(b"one")
        assert held.recv(1024) == b"one"
        assert proxy.cut(1.0) == 1
        assert talk(held) == b""  # dropped
        assert talk() == b""      # refused (closed at once) while cut
        wait_for(lambda: talk() == b"ping", 5, "the proxy to let connections through again")
    finally:
        proxy.close()
        echo.close()


def test_a_stacks_remote_services_stop_once_their_harness_is_killed_outright(tmp_path):
    """The integration tests' stack starts the example's services without the ``sas`` command
    (harness/service.py): a test process killed outright (its timeout, the OOM killer) leaves
    no service behind on a port, as it leaves no worker."""
    marker = f"SAS_TEST_HARNESS={tmp_path}"
    with subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from tests.integration.stack import Stack, free_port
        home = Path({str(tmp_path)!r})
        stack = Stack(home, {{"SAS_TEST_HARNESS": str(home), "PAYMENT_SERVICE_URL": f"http://127.0.0.1:{{free_port()}}",
                             "WAREHOUSE_SERVICE_URL": f"http://127.0.0.1:{{free_port()}}"}})
        stack.services()
        print(stack.requests_seen(), flush=True)
        time.sleep(120)
        """)], stdout=subprocess.PIPE, text=True) as harness:
        try:
            assert harness.stdout is not None and harness.stdout.readline().strip() == "{}"  # both answer
            assert len(live_processes_with(marker)) == 2
        finally:
            harness.kill()
    wait_for(lambda: live_processes_with(marker) == [], 10, "both services to be gone")
