"""A TCP proxy between one worker and PostgreSQL that the chaos run cuts: every connection through
it dropped, and every new one refused, for a while — that worker partitioned from the database while
the others carry on."""

from __future__ import annotations

import socket
import threading
import time

Pair = tuple[socket.socket, socket.socket]


class Proxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target_port``, a thread per direction."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.pairs: set[Pair] = set()
        self.cut_until = 0.0
        self.closed = False
        threading.Thread(target=self._accept, name="proxy", daemon=True).start()

    def cut(self, seconds: float) -> int:
        """Drop every connection now and refuse new ones for ``seconds``; how many were dropped."""
        with self.lock:
            self.cut_until = time.monotonic() + seconds
            pairs = list(self.pairs)
        for pair in pairs:
            self._drop(pair)
        return len(pairs)

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.cut(0)

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            with self.lock:
                refused = time.monotonic() < self.cut_until
            if refused:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            pair = (client, server)
            with self.lock:
                self.pairs.add(pair)
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(src, dst, pair), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, pair: Pair) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(pair)

    def _drop(self, pair: Pair) -> None:
        with self.lock:
            self.pairs.discard(pair)
        for sock in pair:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
