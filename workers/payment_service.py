"""A simulated remote payment service: a real HTTP server process with fault injection.

It behaves as a well-made payment API does: it deduplicates charges by ``Idempotency-Key``,
refuses a request whose ``X-Fencing-Token`` is older than one it already saw for that key (a
zombie attempt waking up late), and keeps its ledger in its own SQLite file, so the ledger
survives a crash of the service. ``GET /ledger`` lists the charges it actually applied;
``GET /requests`` and ``GET /refused`` count, per key, the requests it admitted and those it
refused for a stale fencing token.

Faults, per request (``"fault"`` in the JSON body) or per process (``POST /faults`` or flags):

``transient:N``   the first N requests for this key get 503
``latency:S``     wait S seconds, then charge
``hang:S@A``      on attempt A (default 1) wait S seconds (default 30) and drop the request
``permanent``     402 card declined, every time
``crash[@A]``     (on attempt A) the process exits at once, before charging

Run it with ``python -m workers.payment_service --port 8765`` (or ``sas payment-service``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger("payment_service")

SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    idempotency_key TEXT PRIMARY KEY,
    order_id TEXT NOT NULL,
    amount REAL NOT NULL,
    fencing_token INTEGER NOT NULL,
    charge_id TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS keys (
    idempotency_key TEXT PRIMARY KEY,
    max_token INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    refused INTEGER NOT NULL DEFAULT 0
);
"""


class Ledger:
    """The service's own durable store."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()

    def admit(self, key: str, token: int) -> tuple[bool, int]:
        """Record a request for ``key``; return (not stale, how many requests it has had)."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.db.execute("SELECT max_token, requests FROM keys WHERE idempotency_key = ?", (key,)).fetchone()
            max_token, requests = row if row else (0, 0)
            if token < max_token:
                self.db.execute("UPDATE keys SET refused = refused + 1 WHERE idempotency_key = ?", (key,))
                self.db.execute("COMMIT")
                return False, requests
            self.db.execute(
                "INSERT INTO keys (idempotency_key, max_token, requests) VALUES (?, ?, 1) "
                "ON CONFLICT (idempotency_key) DO UPDATE SET max_token = ?, requests = requests + 1",
                (key, token, token),
            )
            self.db.execute("COMMIT")
            return True, requests + 1

    def charge(self, key: str, order_id: str, amount: float, token: int) -> tuple[dict[str, Any], bool]:
        """Apply the charge once per key; return it and whether it was already applied."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.db.execute(
                "SELECT charge_id, fencing_token FROM ledger WHERE idempotency_key = ?", (key,)
            ).fetchone()
            if row is None:
                charge_id = f"ch_{os.urandom(6).hex()}"
                self.db.execute(
                    "INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?)",
                    (key, order_id, amount, token, charge_id, time.time()),
                )
                duplicate = False
            else:
                charge_id, _ = row
                duplicate = True
            self.db.execute("COMMIT")
        return {"charge_id": charge_id, "idempotency_key": key, "order_id": order_id, "amount": amount}, duplicate

    def requests(self, column: str = "requests") -> dict[str, int]:
        """Per key: requests admitted (``requests``) or refused as stale (``refused``)."""
        assert column in ("requests", "refused")
        with self.lock:
            return dict(self.db.execute(f"SELECT idempotency_key, {column} FROM keys").fetchall())

    def entries(self) -> list[dict[str, Any]]:
        with self.lock:
            rows = self.db.execute(
                "SELECT idempotency_key, order_id, amount, fencing_token, charge_id, at FROM ledger ORDER BY at"
            ).fetchall()
        names = ("idempotency_key", "order_id", "amount", "fencing_token", "charge_id", "at")
        return [dict(zip(names, r, strict=True)) for r in rows]


#: process-wide fault kinds (POST /faults, --*-rate flags) and the per-request fault each draws
FAULT_KINDS = {
    "transient": "transient:1",
    "hang": "hang:30@1",
    "permanent": "permanent",
    "latency": "latency:0.2",
    "crash": "crash",
}


class Faults:
    """Process-wide fault rates, each a probability per request."""

    def __init__(self, seed: int | None = None) -> None:
        self.rates: dict[str, float] = {}
        self.random = random.Random(seed)
        self.lock = threading.Lock()

    def set(self, rates: dict[str, float]) -> None:
        with self.lock:
            self.rates = {k: float(v) for k, v in rates.items() if k in FAULT_KINDS}

    def draw(self, token: int) -> str | None:
        with self.lock:
            roll = self.random.random()
        edge = 0.0
        for kind, rate in sorted(self.rates.items()):
            edge += rate
            if roll < edge:
                if kind == "hang" and token > 1:
                    return None  # a hang only on the first attempt, so a retry can succeed
                return FAULT_KINDS[kind]
        return None


def make_handler(ledger: Ledger, faults: Faults) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply(200, {"ok": True})
            elif self.path == "/ledger":
                self._reply(200, ledger.entries())
            elif self.path == "/requests":
                self._reply(200, ledger.requests())
            elif self.path == "/refused":
                self._reply(200, ledger.requests("refused"))
            else:
                self._reply(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            try:
                body = self._body()
            except (ValueError, UnicodeDecodeError):
                self._reply(400, {"error": "body is not JSON"})
                return
            if self.path == "/faults":
                faults.set(body)
                self._reply(200, {"rates": faults.rates})
            elif self.path == "/charges":
                self._charge(body)
            else:
                self._reply(404, {"error": f"no route {self.path}"})

        def _charge(self, body: Any) -> None:
            key = self.headers.get("Idempotency-Key")
            try:
                token = int(self.headers.get("X-Fencing-Token", ""))
                order_id, amount = str(body["order_id"]), float(body["amount"])
            except (KeyError, TypeError, ValueError):
                self._reply(400, {"error": "need Idempotency-Key, X-Fencing-Token, order_id and amount"})
                return
            if not key:
                self._reply(400, {"error": "need Idempotency-Key"})
                return
            fresh, requests = ledger.admit(key, token)
            if not fresh:
                self._reply(409, {"error": "stale fencing token", "token": token})
                return
            fault = body.get("fault") or faults.draw(token)
            if fault and self._fault(str(fault), token, requests):
                return
            charge, duplicate = ledger.charge(key, order_id, amount, token)
            self._reply(200, {**charge, "duplicate": duplicate})

        def _fault(self, spec: str, token: int, requests: int) -> bool:
            """Apply ``spec``; True when the request has been answered (or dropped)."""
            spec, _, on_attempt = spec.partition("@")
            kind, _, arg = spec.partition(":")
            if on_attempt and int(on_attempt) != token:
                return False
            if kind == "transient" and requests <= int(arg or 1):
                self._reply(503, {"error": "service unavailable (injected)"})
                return True
            if kind == "latency":
                time.sleep(float(arg or 0.5))
                return False
            if kind == "hang":
                time.sleep(float(arg or 30))
                self.close_connection = True
                return True
            if kind == "permanent":
                self._reply(402, {"error": "card declined (injected)"})
                return True
            if kind == "crash":
                log.error("crashing on request (injected)")
                os._exit(3)
            return False

    return Handler


def serve(port: int, ledger_path: Path, host: str = "127.0.0.1", rates: dict[str, float] | None = None,
          seed: int | None = None) -> None:
    faults = Faults(seed)
    faults.set(rates or {})
    server = ThreadingHTTPServer((host, port), make_handler(Ledger(ledger_path), faults))
    server.daemon_threads = True
    log.info("payment service on http://%s:%s, ledger %s", host, port, ledger_path)
    print(f"payment service listening on http://{host}:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="simulated remote payment service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--ledger", type=Path, default=Path(os.environ.get("SAS_HOME", ".sas")) / "payment-ledger.db")
    parser.add_argument("--transient-rate", type=float, default=0.0)
    parser.add_argument("--hang-rate", type=float, default=0.0)
    parser.add_argument("--permanent-rate", type=float, default=0.0)
    parser.add_argument("--crash-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s payment %(levelname)s %(message)s")
    rates = {"transient": args.transient_rate, "hang": args.hang_rate, "permanent": args.permanent_rate,
             "crash": args.crash_rate}
    serve(args.port, args.ledger, args.host, rates, args.seed)


if __name__ == "__main__":
    main()
