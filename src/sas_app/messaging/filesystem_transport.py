"""kombu's filesystem transport (the embedded broker under ``SAS_HOME``), with messages that appear
whole.

kombu's channel creates a message's file under its final name in the queue folder and only then
writes it; a consumer polling the folder can take the file in between, read nothing, and fail to
decode it — an error Celery calls unrecoverable: the worker exits (kombu#1551, open). Seen here:
``sas demo`` from an installed wheel hung until its test's timeout, its agent worker and then its
Scheduler worker gone, each on an empty message. Here a message is written under a name no consumer
looks at (``….msg.part``) and renamed to its final name once whole; a rename within one folder is
atomic, so a consumer sees the whole message or none. A file that still cannot be decoded (written
by something else, or a disk that filled) is left in the processed folder and logged, and the
consumer goes on to the next message rather than exit.

A message's name starts with the moment it was written, in nanoseconds and padded so names sort as
numbers, then its writer's process id and count (unique on the machine, and shorter than kombu's
millisecond and uuid, so a queue's name may be as long as before): kombu takes a queue's messages in
the order their names sort, and a millisecond (as kombu names them) holds several of one run's
notifications. The leading ``t`` sorts after the digits kombu's own names start with: messages
written before an upgrade are taken first.

An exchange's bindings (``<exchange>.exchange``, which fanout messages and Celery's remote control
read) are a file too, and kombu's channel creates it and only then locks it to write, so a worker
binding the same exchange at the same moment — the Scheduler's and the Supervisor's worker starting
together — could read it empty and exit on the decoding error, or empty it. Here an exchange's file
is made whole (``[]``, no bindings) before kombu binds a queue to it, under a name of its own and
then linked to its own: it never exists empty, and kombu's channel, finding it, reads and writes it
under its lock.

``celery_settings`` names :class:`Transport` (:data:`NAME`) as the broker transport for the embedded
broker (``filesystem://``).
"""

from __future__ import annotations

import itertools
import logging
import os
import uuid
from contextlib import suppress
from pathlib import Path
from time import monotonic_ns
from typing import Any

from kombu.connection import resolve_aliases
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

log = logging.getLogger(__name__)

#: the transport's name for kombu and Celery (``broker_transport``)
NAME = f"{__name__}:Transport"
resolve_aliases.setdefault(NAME, "filesystem")


#: this process's messages, counted: two written in the same nanosecond keep their order
_written = itertools.count()


class Channel(filesystem.Channel):
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]  # as kombu's own
        """Write ``payload`` to ``queue``: whole, then under its name."""
        name = f"t{monotonic_ns():020d}_{os.getpid()}_{next(_written):012d}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = f"{final}.part"  # not ``<queue>.msg``: no consumer takes it, nor counts or purges it
        try:
            with open(partial, "wb") as f:
                f.write(dumps(payload).encode("utf-8"))  # type: ignore[no-untyped-call]
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        """The next message of ``queue``, passing over (and logging) any that cannot be decoded."""
        while True:
            try:
                return super()._get(queue)  # type: ignore[no-untyped-call]
            except ValueError as exc:  # json's decode error
                kept = f"kept in {self.processed_folder}" if self.store_processed else "removed"
                log.error("a message on %s could not be decoded and was passed over (%s): %s", queue, kept, exc)

    def _queue_bind(self, exchange: Any, routing_key: Any, pattern: Any, queue: Any) -> None:
        """Bind ``queue`` to ``exchange`` as kombu does, in an exchange file that exists whole."""
        path = self._exchange_file(exchange)  # type: ignore[no-untyped-call]
        self.control_folder.mkdir(exist_ok=True)
        if not path.exists():
            _create_whole(path, b"[]")
        super()._queue_bind(exchange, routing_key, pattern, queue)  # type: ignore[no-untyped-call]


def _create_whole(path: Path, content: bytes) -> None:
    """Make ``path`` with ``content``, unless it exists: written under a name of its own, then linked
    to ``path`` (which fails, changing nothing, where another process got there first)."""
    draft = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        draft.write_bytes(content)
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: created and written, as kombu does
            with suppress(FileExistsError), open(path, "xb") as f:
                f.write(content)
    except OSError as exc:
        raise ChannelError(f"Cannot create {path}") from exc
    finally:
        draft.unlink(missing_ok=True)


class Transport(filesystem.Transport):
    Channel = Channel

    @property
    def default_connection_params(self) -> dict[str, Any]:
        """No host to default to: a folder has none (kombu's virtual transports say ``localhost``
        and warn, on every connection, that no hostname was supplied)."""
        return {"port": self.default_port}
