"""A database some milliseconds away, on one machine: a TCP relay in front of PostgreSQL that holds
each chunk of bytes for half the round trip in each direction (``python -m bench.throughput
--db-latency 2``). Production databases are a network hop from their workers; on this machine
PostgreSQL answers in tens of microseconds, and what a round trip costs a step cannot be seen.

The relay runs on an event loop in a thread of the bench's process; ``asyncio.sleep`` rounds a
wait up to the loop's millisecond, so the shortest round trip it makes is about 2 ms."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk held ``delay`` seconds; close ``writer`` at the end."""
    try:
        while data := await reader.read(1 << 16):
            await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@contextmanager
def slow_link(host: str, port: int, round_trip_ms: float) -> Iterator[int]:
    """Relay 127.0.0.1:<a free port> to ``host:port``, each direction held ``round_trip_ms / 2``;
    yield the port. On leaving, every connection still open is closed and the relay stops."""
    delay = round_trip_ms / 2000
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    listening: list[int] = []

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers = [writer]
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
            writers.append(upstream_writer)
            await asyncio.gather(_pipe(reader, upstream_writer, delay), _pipe(upstream_reader, writer, delay))
        except OSError:
            pass
        finally:
            for each in writers:
                each.close()
                with suppress(OSError, asyncio.CancelledError):
                    await each.wait_closed()

    async def serve() -> None:
        server = await asyncio.start_server(relay, "127.0.0.1", 0)
        listening.append(server.sockets[0].getsockname()[1])
        ready.set()
        try:
            async with server:
                await server.serve_forever()
        finally:  # stopped: end every connection's relay, and let their transports close
            relays = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in relays:
                task.cancel()
            await asyncio.gather(*relays, return_exceptions=True)
            await asyncio.sleep(0)

    serving = loop.create_task(serve())

    def run() -> None:
        try:
            loop.run_until_complete(serving)
        except asyncio.CancelledError:  # stopped on leaving
            pass
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="slow-link", daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the slow link did not start listening")
    try:
        yield listening[0]
    finally:
        loop.call_soon_threadsafe(serving.cancel)
        thread.join(10)
