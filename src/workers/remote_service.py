"""A simulated remote service (the payment service, the warehouse): a real HTTP server process
with fault injection, behaving as a well-made API does.

``POST /do/<action>`` applies an effect (a charge, a stock reservation, a shipment) once per
``Idempotency-Key``; ``POST /undo/<action>`` undoes the effect named by ``do_key`` in the body, once
per its own key. A request whose ``X-Fencing-Token`` is older than one already seen for its key is
refused with 409 (a zombie attempt waking up late). An undo that arrives before its effect leaves a
tombstone, so the late effect is refused too (409) instead of applied after its undo. The ledger
lives in the service's own SQLite file and survives a crash of the service.

``POST /check/<action>`` answers a question (a fraud score) and changes nothing: no ledger entry.

``GET /ledger`` lists every effect and undo actually applied; ``GET /requests`` and
``GET /refused`` count, per key, the requests admitted and those refused as stale.

Faults, per request (``"fault"`` in the JSON body) or per process (``POST /faults`` or flags):

``transient:N``   the first N requests for this key get 503
``latency:S``     wait S seconds, then apply
``hang:S@A``      on attempt A (default: every attempt) wait S seconds (default 30) and drop the request
``permanent``     422 refused (a declined card, no stock), every time
``crash[@A]``     (on attempt A) the process exits at once, before applying anything

Process-wide, ``down`` at rate 1 (``POST /faults {"down": 1}``) answers every request 503: the
service is down for everyone until the rates are set again.

Run it with ``sas payment-service --port 8765`` or ``sas warehouse-service --port 8766``.
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

log = logging.getLogger("remote_service")

SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    idempotency_key TEXT PRIMARY KEY,
    action TEXT NOT NULL,
    order_id TEXT NOT NULL,
    amount REAL,
    fencing_token INTEGER NOT NULL,
    effect_id TEXT NOT NULL,
    undoes TEXT,
    undone_by TEXT,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS keys (
    idempotency_key TEXT PRIMARY KEY,
    max_token INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    refused INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS tombstones (idempotency_key TEXT PRIMARY KEY, undo_key TEXT NOT NULL);
"""

COLUMNS = ("idempotency_key", "action", "order_id", "amount", "fencing_token", "effect_id", "undoes",
           "undone_by", "at")

#: process-wide fault kinds (POST /faults, --*-rate flags) and the per-request fault each draws
FAULT_KINDS = {
    "transient": "transient:1",
    "hang": "hang:30@1",
    "permanent": "permanent",
    "latency": "latency:0.2",
    "crash": "crash",
    "down": f"transient:{2**31}",
}


class Refused(Exception):
    """The request is refused with 409: a stale token, or an effect already undone."""


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

    def do(self, key: str, action: str, order_id: str, amount: float | None, token: int) -> tuple[dict[str, Any], bool]:
        """Apply the effect once per key; return it and whether it had been applied already."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                if self.db.execute("SELECT 1 FROM tombstones WHERE idempotency_key = ?", (key,)).fetchone():
                    raise Refused(f"{action} {key} was undone before it was done")
                row = self._entry(key)
                duplicate = row is not None
                if row is None:
                    self.db.execute(
                        "INSERT INTO ledger (idempotency_key, action, order_id, amount, fencing_token, effect_id, at) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (key, action, order_id, amount, token, f"{action[:3]}_{os.urandom(6).hex()}", time.time()),
                    )
                    row = self._entry(key)
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
        assert row is not None
        return row, duplicate

    def undo(self, key: str, action: str, do_key: str, order_id: str, token: int) -> tuple[dict[str, Any], bool]:
        """Undo the effect ``do_key`` once per undo key; if it never happened, leave a tombstone."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            row = self._entry(key)
            duplicate = row is not None
            if row is None:
                done = self._entry(do_key)
                if done is None:
                    self.db.execute("INSERT OR IGNORE INTO tombstones VALUES (?, ?)", (do_key, key))
                self.db.execute(
                    "INSERT INTO ledger (idempotency_key, action, order_id, amount, fencing_token, effect_id, "
                    "undoes, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (key, f"undo:{action}", order_id, None if done is None else done["amount"], token,
                     f"und_{os.urandom(6).hex()}", do_key if done else None, time.time()),
                )
                if done is not None:
                    self.db.execute("UPDATE ledger SET undone_by = ? WHERE idempotency_key = ?", (key, do_key))
                row = self._entry(key)
            self.db.execute("COMMIT")
        assert row is not None
        return row, duplicate

    def _entry(self, key: str) -> dict[str, Any] | None:
        row = self.db.execute(f"SELECT {', '.join(COLUMNS)} FROM ledger WHERE idempotency_key = ?", (key,)).fetchone()
        return None if row is None else dict(zip(COLUMNS, row, strict=True))

    def counts(self, column: str = "requests") -> dict[str, int]:
        """Per key: requests admitted (``requests``) or refused as stale (``refused``)."""
        assert column in ("requests", "refused")
        with self.lock:
            return dict(self.db.execute(f"SELECT idempotency_key, {column} FROM keys").fetchall())

    def entries(self) -> list[dict[str, Any]]:
        with self.lock:
            rows = self.db.execute(f"SELECT {', '.join(COLUMNS)} FROM ledger ORDER BY at").fetchall()
        return [dict(zip(COLUMNS, r, strict=True)) for r in rows]


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
            elif self.path in ("/requests", "/refused"):
                self._reply(200, ledger.counts(self.path.strip("/")))
            else:
                self._reply(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:
            try:
                body = self._body()
                if not isinstance(body, dict):
                    raise ValueError("not an object")
            except (ValueError, UnicodeDecodeError):
                self._reply(400, {"error": "body is not a JSON object"})
                return
            verb, _, action = self.path.strip("/").partition("/")
            if self.path == "/faults":
                faults.set(body)
                self._reply(200, {"rates": faults.rates})
            elif verb in ("do", "undo", "check") and action:
                self._effect(verb, action, body)
            else:
                self._reply(404, {"error": f"no route {self.path}"})

        def _effect(self, verb: str, action: str, body: dict[str, Any]) -> None:
            key = self.headers.get("Idempotency-Key")
            try:
                token = int(self.headers.get("X-Fencing-Token", ""))
                order_id = str(body["order_id"])
                amount = None if body.get("amount") is None else float(body["amount"])
                do_key = str(body["do_key"]) if verb == "undo" else ""
            except (KeyError, TypeError, ValueError):
                self._reply(400, {"error": "need Idempotency-Key, X-Fencing-Token, order_id (and do_key to undo)"})
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
            if verb == "check":  # a question, not an effect: nothing to record
                self._reply(200, {"effect_id": None, "score": round((amount or 0.0) % 1, 2)})
                return
            try:
                if verb == "do":
                    entry, duplicate = ledger.do(key, action, order_id, amount, token)
                else:
                    entry, duplicate = ledger.undo(key, action, do_key, order_id, token)
            except Refused as exc:
                self._reply(409, {"error": str(exc)})
                return
            self._reply(200, {**entry, "duplicate": duplicate})

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
                self._reply(422, {"error": "refused (injected)"})
                return True
            if kind == "crash":
                log.error("crashing on request (injected)")
                os._exit(3)
            return False

    return Handler


def serve(name: str, port: int, ledger_path: Path, host: str = "127.0.0.1", rates: dict[str, float] | None = None,
          seed: int | None = None) -> None:
    faults = Faults(seed)
    faults.set(rates or {})
    server = ThreadingHTTPServer((host, port), make_handler(Ledger(ledger_path), faults))
    server.daemon_threads = True
    log.info("%s service on http://%s:%s, ledger %s", name, host, port, ledger_path)
    print(f"{name} service listening on http://{host}:{server.server_port}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a simulated remote service with fault injection")
    parser.add_argument("--name", default="payment", help="the service's name, in logs and the default ledger file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--ledger", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=None)
    for kind in FAULT_KINDS:
        parser.add_argument(f"--{kind}-rate", type=float, default=0.0, help=f"share of requests given a {kind} fault")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.name} %(levelname)s %(message)s")
    ledger = args.ledger or Path(os.environ.get("SAS_HOME", ".sas")) / f"{args.name}-ledger.db"
    rates = {kind: getattr(args, f"{kind}_rate") for kind in FAULT_KINDS}
    serve(args.name, args.port, ledger, args.host, rates, args.seed)


if __name__ == "__main__":
    main()
