"""Signed work from the broker: ``sas.submit`` and ``sas.signal`` carrying an HMAC that proves
they were sent by someone holding a shared key.

Anyone who can write to the broker can send those two tasks; with ``SAS_BROKER_TRUST=signed`` the
Scheduler takes them only with a valid ``sas_signature`` keyword argument: ``{"key": <key id>,
"ts": <epoch seconds>, "mac": <hex>}``, where ``mac`` is HMAC-SHA256, under the key named, of the
canonical JSON (keys sorted, no spaces, UTF-8) of ``{"task": <task name>, "kwargs": <the task's
other keyword arguments>, "ts": <ts>}``. A signature older than ``SAS_BROKER_SIGNATURE_MAX_AGE``
(or from further than that in the future) is refused. Inside that window a replayed message
changes nothing: a submission is idempotent on its business key, and a wait takes one signal.

Keys are ``SAS_BROKER_KEYS="<id>:<secret>[,<id>:<secret>...]"``: each verifies; the first signs
(what a Scheduler re-sends when it retries a message, and what :class:`sas_app.Producer` signs
with when given it). Rotating: add the new key last, move the producers to it, drop the old one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: the keyword argument a signed task carries
SIGNATURE = "sas_signature"
#: how a deployment trusts the broker's submissions and signals (SAS_BROKER_TRUST)
TRUST = ("open", "signed", "closed")
#: the shortest secret a key may have, in characters
MIN_SECRET = 32
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,40}")
_MAC = re.compile(r"[0-9a-fA-F]{64}")


class BadSignature(ValueError):
    """Why a task's signature was refused; ``authentic``: made with a key here, only too old."""

    def __init__(self, message: str, *, authentic: bool = False) -> None:
        super().__init__(message)
        self.authentic = authentic


def parse_keys(spec: str) -> dict[str, str]:
    """``"<id>:<secret>[,<id>:<secret>...]"`` in order (the first signs); ``ValueError`` naming
    what is wrong (never the secret)."""
    keys: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key_id, sep, secret = item.partition(":")
        if not sep or not _KEY_ID.fullmatch(key_id):
            raise ValueError("SAS_BROKER_KEYS must be <id>:<secret>[,<id>:<secret>...], each id 1-40 letters, "
                             "digits, '_', '.' or '-'")
        if len(secret) < MIN_SECRET:
            raise ValueError(f"SAS_BROKER_KEYS: the secret of key {key_id!r} is shorter than {MIN_SECRET} characters")
        if key_id in keys:
            raise ValueError(f"SAS_BROKER_KEYS: key {key_id!r} is given twice")
        keys[key_id] = secret
    return keys


def canonical(task: str, kwargs: Mapping[str, Any], ts: float) -> bytes:
    """What the MAC is computed over. ``TypeError`` or ``ValueError`` for what JSON cannot hold."""
    body = {"task": task, "kwargs": {k: v for k, v in kwargs.items() if k != SIGNATURE}, "ts": ts}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def sign(task: str, kwargs: Mapping[str, Any], key_id: str, secret: str, now: float) -> dict[str, Any]:
    """The ``sas_signature`` for sending ``task`` with ``kwargs`` at ``now``: over ``kwargs`` as the
    worker will read them back from JSON (a mapping's integer keys become strings)."""
    as_delivered = json.loads(json.dumps(dict(kwargs), allow_nan=False))
    mac = hmac.new(secret.encode(), canonical(task, as_delivered, now), hashlib.sha256).hexdigest()
    return {"key": key_id, "ts": now, "mac": mac}


class Verified(str):
    """The id of the key a message was verified with."""


def verify(task: str, kwargs: Mapping[str, Any], keys: Mapping[str, str], max_age: float, now: float) -> Verified:
    """The id of the key that signed ``kwargs`` for ``task``; :class:`BadSignature` saying why not
    (``authentic`` on it: the MAC held, the message is only too old)."""
    signature = kwargs.get(SIGNATURE)
    if signature is None:
        raise BadSignature("the message is not signed")
    if not isinstance(signature, dict) or set(signature) != {"key", "ts", "mac"}:
        raise BadSignature(f"{SIGNATURE} must be {{key, ts, mac}}")
    key_id, ts, mac = signature["key"], signature["ts"], signature["mac"]
    if not isinstance(key_id, str) or key_id not in keys:
        raise BadSignature(f"no key {str(key_id)[:40]!r} here (SAS_BROKER_KEYS)")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) \
            or not isinstance(mac, str) or not _MAC.fullmatch(mac):
        raise BadSignature(f"{SIGNATURE}'s ts must be a finite number and its mac 64 hexadecimal digits")
    try:
        body = canonical(task, kwargs, ts)
    except (TypeError, ValueError) as exc:  # what a JSON decoder made of a marker kombu knows (a decimal, a date)
        raise BadSignature(f"the message holds what a signature cannot cover: {exc}") from None
    expected = hmac.new(keys[key_id].encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), mac.lower().encode()):
        raise BadSignature(f"the signature does not match the message under key {key_id!r}: "
                           "it was changed, or signed with another secret")
    age = now - ts
    if abs(age) > max_age:
        raise BadSignature(f"the signature is {age:.0f} s {'old' if age > 0 else 'ahead'}, over the "
                           f"{max_age:g} s allowed (SAS_BROKER_SIGNATURE_MAX_AGE): a replay, or a message held "
                           "too long", authentic=True)
    return Verified(key_id)


class Gate:
    """The Scheduler's door for ``sas.submit`` and ``sas.signal`` from the broker, as
    SAS_BROKER_TRUST says. ``on_refusal(task, kwargs, claimed_key, reason)`` is told of each
    message refused (the app writes it to the audit trail)."""

    def __init__(self, trust: str, keys: str, max_age: float, clock: Callable[[], float] = time.time) -> None:
        if trust not in TRUST:
            raise ValueError(f"SAS_BROKER_TRUST must be one of {', '.join(TRUST)}, got {trust!r}")
        if not math.isfinite(max_age) or max_age <= 0:
            raise ValueError(f"SAS_BROKER_SIGNATURE_MAX_AGE must be a positive number of seconds, got {max_age!r}")
        self.trust = trust
        self.keys = parse_keys(keys)
        self.max_age = max_age
        self.clock = clock
        self.on_refusal: Callable[[str, Mapping[str, Any], str, str], None] | None = None

    def admit(self, task: str, kwargs: Mapping[str, Any], args: Sequence[Any] = ()) -> Verified | None:
        """The id of the key that verified the message (None: unsigned, on an open broker);
        :class:`BadSignature` saying why it is refused, after telling ``on_refusal``. Nothing a
        message holds makes this raise anything else."""
        signed = kwargs.get(SIGNATURE) is not None
        try:
            if self.trust == "closed":
                raise BadSignature(f"this deployment takes no {task} from the broker (SAS_BROKER_TRUST=closed)")
            if self.trust == "open" and not (signed and self.keys):
                return None
            if args:
                raise BadSignature("a signed message carries keyword arguments only (its positional ones would "
                                   "not be covered)")
            return verify(task, kwargs, self.keys, self.max_age, self.clock())
        except BadSignature as exc:
            claimed = kwargs.get(SIGNATURE)
            key_id = str(claimed.get("key"))[:40] if isinstance(claimed, dict) else ""
            if self.on_refusal is not None:
                self.on_refusal(task, kwargs, key_id, str(exc))
            raise

    def resigned(self, task: str, kwargs: Mapping[str, Any], verified: Verified | None) -> dict[str, Any]:
        """``kwargs`` signed anew with the first key, for a message this worker sends again after
        :meth:`admit` verified it (a retry while the store is down must not age past the window);
        one it did not verify goes as it came."""
        out = {k: v for k, v in kwargs.items() if k != SIGNATURE}
        if verified is None:
            return dict(kwargs)
        key_id, secret = next(iter(self.keys.items()))
        out[SIGNATURE] = sign(task, out, key_id, secret, self.clock())
        return out
