"""Who may do what: four roles, the actor an action is taken by, and the API's tokens.

The roles, each allowed what the ones before it are: ``viewer`` reads; ``approver`` answers the
waits (sends signals); ``operator`` acts on runs (submits, cancels, compensates, pauses, resumes,
resubmits, marks done, reruns); ``admin`` manages access (tokens). The dashboard and the API ask
:func:`require` the same question; the CLI, which holds the database's URL, is trusted and acts as
``admin`` under the OS user's name.

A token is ``sas_<id>_<secret>``: the id finds its row, the secret is compared with the SHA-256
kept there (in constant time), so neither the table nor a log of ids gives a token away. It is
shown once, at creation; it expires, and may be revoked.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import re
import secrets
import socket
from dataclasses import dataclass

from sas_app.errors import InvalidOperation, NotAllowed
from sas_app.states import Role
from sas_app.store import Store
from sas_app.store.rows import TokenRow

#: each role, in the order of what it may do (each may do what the ones before it may)
ROLES = tuple(Role)
#: what each role may do beyond reading, in words (for the docs and refusals)
MAY = {Role.VIEWER: "read runs and alerts", Role.APPROVER: "answer waits (send signals)",
       Role.OPERATOR: "submit and act on runs", Role.ADMIN: "manage tokens"}
#: a token's lifetime when none is given: 90 days
DEFAULT_LIFETIME = 90 * 86400.0
#: the longest a token may live: two years
MAX_LIFETIME = 2 * 365 * 86400.0
TOKEN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}")
_TOKEN = re.compile(r"sas_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
_TOKEN_IN_TEXT = re.compile(r"sas_[0-9a-f]{12}_")


def looks_like_token(text: str) -> bool:
    """Whether ``text`` holds what may be a token (to refuse it where it would be logged)."""
    return _TOKEN_IN_TEXT.search(text) is not None


@dataclass(frozen=True)
class Actor:
    """Who takes an action: a user's or a token's ``name``, the ``role`` they hold, the door
    (``via``: cli, api, dashboard, broker) and where from (``origin``: an address; a CLI's OS user
    and host)."""

    name: str
    role: Role
    via: str
    origin: str

    @classmethod
    def cli(cls, name: str = "") -> Actor:
        """The CLI's actor: ``name`` (its ``--by``, else the OS user), trusted as admin."""
        user = getpass.getuser()
        return cls(name or user, Role.ADMIN, "cli", f"{user}@{socket.gethostname()}")


def role_of(text: str) -> Role:
    try:
        return Role(text)
    except ValueError:
        raise InvalidOperation(f"unknown role {text!r}; one of {', '.join(ROLES)}") from None


def require(actor: Actor, needed: Role, what: str) -> None:
    """:class:`NotAllowed` (403) unless ``actor``'s role is ``needed`` or above."""
    if ROLES.index(actor.role) < ROLES.index(needed):
        raise NotAllowed(f"{actor.name} is {actor.role}: {what} needs the {needed} role or above")


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Tokens:
    def __init__(self, store: Store) -> None:
        self.store = store

    def create(self, name: str, role: str, *, by: str, lifetime: float = DEFAULT_LIFETIME) -> tuple[TokenRow, str]:
        """A new token: its row and the token itself, which is not kept anywhere (only its digest)."""
        if not isinstance(name, str) or not TOKEN_NAME.fullmatch(name):
            raise InvalidOperation(f"a token's name is 1-100 letters, digits, '_', '.', '@' or '-', got {name!r}")
        chosen = role_of(role)
        if not 0 < lifetime <= MAX_LIFETIME:
            raise InvalidOperation(f"a token lives more than 0 s and at most {MAX_LIFETIME / 86400:.0f} days, "
                             f"got {lifetime:g} s")
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        row = self.store.insert_token(token_id, name, chosen.value, digest(secret), by, lifetime)
        return row, f"sas_{token_id}_{secret}"

    def verify(self, token: str) -> TokenRow:
        """The live token ``token`` is; :class:`NotAllowed` (401) saying why not otherwise."""
        found = _TOKEN.fullmatch(token.strip())
        if found is None:
            raise NotAllowed("not a sas_app token (sas_<id>_<secret>)", 401)
        known = self.store.token(found.group(1))
        if known is None or not hmac.compare_digest(known[0].secret_sha256, digest(found.group(2))):
            raise NotAllowed("unknown token", 401)
        row, now = known
        if row.revoked_at is not None:
            raise NotAllowed(f"token {row.name!r} was revoked", 401)
        if row.expires_at <= now:
            raise NotAllowed(f"token {row.name!r} has expired", 401)
        return row

    def find(self, id_or_name: str) -> TokenRow:
        """The token with this id, or the one live token with this name."""
        rows = self.store.tokens()
        by_id = [r for r in rows if r.id == id_or_name]
        live = [r for r in rows if r.name == id_or_name and r.revoked_at is None]
        if by_id:
            return by_id[0]
        if len(live) == 1:
            return live[0]
        if live:
            raise InvalidOperation(f"{len(live)} live tokens are named {id_or_name!r}: name one by its id "
                             f"({', '.join(r.id for r in live)})")
        raise InvalidOperation(f"no token with id or live name {id_or_name!r}")

    def revoke(self, id_or_name: str, *, by: str) -> TokenRow:
        row = self.find(id_or_name)
        if not self.store.revoke_token(row.id, by):
            raise InvalidOperation(f"token {row.name!r} ({row.id}) was revoked already")
        return self.find(row.id)
