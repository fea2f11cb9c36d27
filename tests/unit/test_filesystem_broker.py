"""The embedded broker (kombu's filesystem transport under SAS_HOME, ``sas demo``'s): a consumer
never takes a message before it is whole, and one it cannot decode does not stop it — kombu's
own channel names a message's file before writing it, and a worker that read the empty file exited
("Unrecoverable error: JSONDecodeError"), leaving the demo waiting for it."""

from __future__ import annotations

import json
import logging
import multiprocessing
import threading
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from sas_app.app import SasApp
from sas_app.messaging import filesystem_transport
from sas_app.settings import Settings


def embedded(tmp_path: Path) -> Connection:
    """A connection to the embedded broker as a sas_app process under ``tmp_path`` opens it."""
    conf = SasApp(Settings(home=tmp_path, broker_url="")).celery.conf
    assert conf.broker_transport == filesystem_transport.NAME
    return Connection("filesystem://", transport=conf.broker_transport,
                      transport_options=conf.broker_transport_options)


def test_a_consumer_never_finds_a_message_not_yet_whole(tmp_path):
    queue_folder = tmp_path / "broker" / "queue"
    seen_partial: list[str] = []
    done = threading.Event()

    def look() -> None:  # a consumer's view: every message file of the queue, read as soon as listed
        while not done.is_set():
            for name in [n for n in (p.name for p in queue_folder.iterdir()) if n.endswith(".big.msg")]:
                try:
                    text = (queue_folder / name).read_text()
                except FileNotFoundError:
                    continue
                try:
                    json.loads(text)
                except ValueError:
                    seen_partial.append(name)

    with embedded(tmp_path) as conn:
        channel = conn.default_channel
        looker = threading.Thread(target=look)
        looker.start()
        try:
            for i in range(400):
                channel._put("big", {"body": "x" * 200_000, "i": i})
        finally:
            done.set()
            looker.join(timeout=10)
        assert seen_partial == []
        # and every one of them is there
        assert sorted(channel._get("big")["i"] for _ in range(400)) == list(range(400))


def test_messages_come_out_in_the_order_they_were_put(tmp_path):
    """A run's notifications, written within one millisecond, reach its submitter in order (kombu
    takes a queue's files in the order their names sort)."""
    with embedded(tmp_path) as conn:
        channel = conn.default_channel
        for i in range(500):
            channel._put("notes", {"i": i})
        assert [channel._get("notes")["i"] for _ in range(500)] == list(range(500))


def test_a_queue_named_as_long_as_a_reply_queue_may_be_takes_messages(tmp_path):
    """``reply_to`` may be 200 characters: a message file's name (at most 255 bytes) holds it."""
    with embedded(tmp_path) as conn:
        channel = conn.default_channel
        channel._put("r" * 200, {"i": 1})
        assert channel._get("r" * 200) == {"i": 1}


def test_messages_written_before_an_upgrade_are_taken_first(tmp_path):
    """kombu's own names start with a millisecond's digits; a message left under one is older than
    any this transport writes now."""
    with embedded(tmp_path) as conn:
        channel = conn.default_channel
        channel._put("orders", {"i": 2})
        (tmp_path / "broker" / "queue" / "1764460000000_0b7e.orders.msg").write_text(json.dumps({"i": 1}))
        assert [channel._get("orders")["i"] for _ in range(2)] == [1, 2]


def _bind_in_turns(home: Path, me: int, rounds: int, start: Any, failures: Any) -> None:
    """One worker's part of the exchange race: at each round, with the others, bind a queue of its
    own to an exchange nobody has bound before."""
    with embedded(home) as conn:
        channel = conn.default_channel
        for r in range(rounds):
            start.wait()
            try:
                channel._queue_bind(f"fresh{r}", "", "", f"q{me}")
            except Exception as exc:  # what a worker starting would die of
                failures.put(f"round {r}, worker {me}: {exc!r}")


@pytest.mark.integration  # real processes
def test_workers_binding_a_new_exchange_at_once_neither_fail_nor_lose_a_binding(tmp_path):
    """The Scheduler's and the Supervisor's worker start together and bind their queues to the same
    new exchanges (Celery's remote control): kombu's channel created the exchange's file empty and
    only then locked it, and a worker that read it empty exited (JSONDecodeError) — in ``sas demo``,
    the Supervisor, leaving a crashed step to wait for ever."""
    rounds, workers = 150, 4
    ctx = multiprocessing.get_context("spawn")
    start, failures = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_bind_in_turns, args=(tmp_path, me, rounds, start, failures)) for me in range(workers)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * workers
    found = []
    while not failures.empty():
        found.append(failures.get())
    assert found == []
    with embedded(tmp_path) as conn:
        lost = {r: queues for r in range(rounds)
                if len(queues := {q.queue for q in conn.default_channel.get_table(f"fresh{r}")}) != workers}
    assert lost == {}


def test_a_message_that_cannot_be_decoded_is_passed_over_and_logged_not_fatal(tmp_path, caplog):
    with embedded(tmp_path) as conn:
        queue = conn.SimpleQueue("orders")
        # empty, and first in line: names sort as text, and a real one starts with its nanosecond
        torn = f"{0:020d}_torn.orders.msg"
        (tmp_path / "broker" / "queue" / torn).write_bytes(b"")
        queue.put({"order": 7})
        with caplog.at_level(logging.ERROR, logger="sas_app.messaging.filesystem_transport"):
            assert queue.get(timeout=5).payload == {"order": 7}
        assert "a message on orders could not be decoded and was passed over" in caplog.text
        assert (tmp_path / "broker" / "processed" / torn).exists()  # kept to look at
        queue.close()
