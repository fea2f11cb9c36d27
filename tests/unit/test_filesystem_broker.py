"""The embedded broker (kombu's filesystem transport under SAS_HOME, ``sas demo``'s): a consumer
never takes a message before it is whole, and one it cannot decode does not stop it — kombu's
own channel names a message's file before writing it, and a worker that read the empty file exited
("Unrecoverable error: JSONDecodeError"), leaving the demo waiting for it."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

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
        # and every one of them is there (in the order of their millisecond: kombu's)
        assert sorted(channel._get("big")["i"] for _ in range(400)) == list(range(400))


def test_a_message_that_cannot_be_decoded_is_passed_over_and_logged_not_fatal(tmp_path, caplog):
    with embedded(tmp_path) as conn:
        queue = conn.SimpleQueue("orders")
        # empty, and first in line: names sort as text, and a real one starts with its millisecond
        (tmp_path / "broker" / "queue" / "0_torn.orders.msg").write_bytes(b"")
        queue.put({"order": 7})
        with caplog.at_level(logging.ERROR, logger="sas_app.messaging.filesystem_transport"):
            assert queue.get(timeout=5).payload == {"order": 7}
        assert "a message on orders could not be decoded and was passed over" in caplog.text
        assert (tmp_path / "broker" / "processed" / "0_torn.orders.msg").exists()  # kept to look at
        queue.close()
