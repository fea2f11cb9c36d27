"""kombu's in-memory transport with its queues kept per virtual host.

kombu's own keeps one set of queues for the whole process: two apps in one process on
``memory://`` take each other's messages. Here ``memory://localhost/a`` and
``memory://localhost/b`` share nothing, so the test kit gives each environment a virtual host of
its own and two environments can live side by side. ``celery_settings`` names :class:`Transport`
(:data:`NAME`) as the broker transport of every ``memory://`` URL (:func:`options_for`), as the
:class:`~sas_app.Producer` does.
"""

from __future__ import annotations

from collections import defaultdict
from queue import Queue
from typing import Any

from kombu.connection import resolve_aliases
from kombu.transport import memory

#: the transport's name for kombu and Celery (``broker_transport``)
NAME = f"{__name__}:Transport"
resolve_aliases.setdefault(NAME, "memory")

#: each virtual host's queues, by name
_QUEUES: defaultdict[str, dict[str, Queue[Any]]] = defaultdict(dict)


def options_for(broker_url: str) -> dict[str, str]:
    """The Celery settings that put a ``memory://`` broker URL on this transport (none for another)."""
    return {"broker_transport": NAME} if broker_url.startswith("memory://") else {}


def forget(virtual_host: str) -> None:
    """Drop a virtual host's queues and the messages in them (an environment closing)."""
    _QUEUES.pop(virtual_host, None)


class Channel(memory.Channel):
    def __init__(self, connection: Any, **kwargs: Any) -> None:
        # kombu's ``queues`` is a class attribute, one dict for every channel of the process
        self.queues = _QUEUES[connection.client.virtual_host]
        super().__init__(connection, **kwargs)  # type: ignore[no-untyped-call]


class Transport(memory.Transport):
    Channel = Channel
