"""Who uses the dashboard, and with which role (:class:`~sas_app.states.Role`).

A person is known by the dashboard's basic auth (``--basic-auth``, the same ``user:password`` list
as Flower's) or, behind a reverse proxy that authenticates people, by the header the proxy sets
(``--user-header``: only where nothing but the proxy can reach the dashboard). Their role comes
from ``--roles`` (``alice=operator,bob=approver``); a person it does not name is a viewer — and
when no ``--roles`` is given at all, everyone the dashboard lets in is an operator, as before roles
existed. With neither credentials nor a header, the dashboard only reads, for anyone.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from flask import Request, Response

from sas_app.states import Role


def parse_basic_auth(spec: str) -> list[tuple[str, str]]:
    """``"user:password[,user:password…]"``, as Flower's ``--basic-auth`` takes it."""
    pairs = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        user, sep, password = item.partition(":")
        if not sep or not user or not password:
            raise ValueError("basic auth must be user:password[,user:password...]")
        pairs.append((user, password))
    return pairs


def parse_roles(spec: str) -> dict[str, Role]:
    """``"alice=operator,bob=approver"``; ``ValueError`` naming a role that is not one."""
    roles = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        user, sep, role = item.partition("=")
        if not sep or not user.strip() or role.strip() not in {r.value for r in Role}:
            raise ValueError(f"roles must be user=role[,user=role...] with a role of "
                             f"{', '.join(r.value for r in Role)}; got {item!r}")
        roles[user.strip()] = Role(role.strip())
    return roles


@dataclass(frozen=True)
class Person:
    name: str
    role: Role

    def may(self, role: Role) -> bool:
        return list(Role).index(self.role) >= list(Role).index(role)


#: anyone, on a dashboard with neither credentials nor a proxy's header: reads only
ANYONE = Person("", Role.VIEWER)


@dataclass(frozen=True)
class People:
    basic_auth: Sequence[tuple[str, str]] = ()
    roles: Mapping[str, Role] = field(default_factory=dict)
    user_header: str = ""

    @property
    def known(self) -> bool:
        """Whether the dashboard knows who is using it (else: read-only for anyone)."""
        return bool(self.basic_auth or self.user_header)

    def role_of(self, name: str) -> Role:
        return self.roles.get(name, Role.VIEWER) if self.roles else Role.OPERATOR

    def identify(self, request: Request) -> Person | Response:
        """Who sent ``request``, or the 401 that asks them who they are."""
        if not self.known:
            return ANYONE
        if self.user_header:
            name = request.headers.get(self.user_header, "").strip()
            if not name:
                return Response(f"no user in the {self.user_header} header: reach the dashboard through its proxy\n",
                                401)
            return Person(name, self.role_of(name))
        given = request.authorization
        if given is not None and given.type == "basic":
            name, secret = str(given.username), str(given.password)
            for user, password in self.basic_auth:
                if hmac.compare_digest(name, user) and hmac.compare_digest(secret, password):
                    return Person(user, self.role_of(user))
        return Response("credentials required\n", 401, {"WWW-Authenticate": 'Basic realm="sas dashboard"'})
