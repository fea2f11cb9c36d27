"""kombu's Redis transport, with one client per channel instead of one per command.

kombu's Redis channel builds a new ``redis.Redis`` around its connection pool for every publish and
every acknowledgement. With redis-py 5 and later that object copies all its response callbacks
each time it is built: twice for every message a worker takes and once for every message sent, a
share of sas_app's CPU per step worth saving. A client holds nothing but its pool and those
callbacks (every command takes a connection from the pool and gives it back), so a channel can keep
one, built again only when its pool is. It also mends one way kombu's channel fails when closed
after its connection (:meth:`Channel._get_pool`).

``celery_settings`` names :class:`Transport` (:data:`NAME`) as the broker transport for
``redis://`` URLs; a connection on it still shows and hands out its URL as ``redis://`` (worker
banners, Flower's broker page).
"""

from __future__ import annotations

from typing import Any

from kombu.connection import resolve_aliases
from kombu.transport import redis
from redis.exceptions import ConnectionError as RedisConnectionError

#: the transport's name for kombu and Celery (``broker_transport``)
NAME = f"{__name__}:Transport"
resolve_aliases.setdefault(NAME, "redis")


class Channel(redis.Channel):
    _sync_client: Any = None

    def _get_pool(self, asynchronous: bool = False) -> Any:
        """A new connection pool for the channel — unless the connection's transport is closed
        already. kombu then fails with an AttributeError (reading the URL of a connection that has
        none); Celery, closing a channel after a lost broker connection with
        messages unacknowledged, takes that for an unrecoverable error and the worker exits (seen
        with Redis killed under a chaos run). A connection error instead is what Celery expects
        there: it goes on reconnecting, and those messages wait in Redis's unacked set for the
        visibility timeout."""
        if self.connection.client is None:
            raise RedisConnectionError("the broker connection is closed")
        return super()._get_pool(asynchronous=asynchronous)  # type: ignore[no-untyped-call]

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        client = self._sync_client
        if client is None or client.connection_pool is not self.pool:
            client = self._sync_client = super()._create_client()  # type: ignore[no-untyped-call]
        return client


class Transport(redis.Transport):
    Channel = Channel
