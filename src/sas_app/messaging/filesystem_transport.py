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

``celery_settings`` names :class:`Transport` (:data:`NAME`) as the broker transport for the embedded
broker (``filesystem://``).
"""

from __future__ import annotations

import logging
import os
import uuid
from time import monotonic
from typing import Any

from kombu.connection import resolve_aliases
from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.json import dumps

log = logging.getLogger(__name__)

#: the transport's name for kombu and Celery (``broker_transport``)
NAME = f"{__name__}:Transport"
resolve_aliases.setdefault(NAME, "filesystem")


class Channel(filesystem.Channel):
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]  # as kombu's own
        """Write ``payload`` to ``queue``: whole, then under its name."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
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


class Transport(filesystem.Transport):
    Channel = Channel

    @property
    def default_connection_params(self) -> dict[str, Any]:
        """No host to default to: a folder has none (kombu's virtual transports say ``localhost``
        and warn, on every connection, that no hostname was supplied)."""
        return {"port": self.default_port}
