"""Who uses the dashboard, and with which role (:class:`~sas_app.states.Role`).

A person is known by the dashboard's basic auth (``--basic-auth``, the same ``user:password`` list
as Flower's) or, behind a reverse proxy that authenticates people, by the header the proxy sets
(``--user-header``), believed only from the proxy's addresses (``--proxy-addresses``, loopback
unless told). Their role comes from ``--roles`` (``alice=operator,bob=approver``); a person it
does not name is a viewer — except that with basic auth and no ``--roles`` at all, everyone the
dashboard lets in is an operator, as before roles existed. With neither credentials nor a header,
the dashboard only reads, for anyone.
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


#: where a reverse proxy's user header is taken from unless ``--proxy-addresses`` says otherwise
LOOPBACK = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class People:
    basic_auth: Sequence[tuple[str, str]] = ()
    roles: Mapping[str, Role] = field(default_factory=dict)
    user_header: str = ""
    #: the addresses the user header is believed from (the proxy's); from any other, refused
    proxies: Sequence[str] = LOOPBACK

    @property
    def known(self) -> bool:
        """Whether the dashboard knows who is using it (else: read-only for anyone)."""
        return bool(self.basic_auth or self.user_header)

    def role_of(self, name: str) -> Role:
        """The role ``--roles`` gives ``name``; unnamed, a viewer — or, with basic auth and no
        ``--roles`` at all, an operator (everyone who has the password acts, as before roles)."""
        if self.roles or self.user_header:
            return self.roles.get(name, Role.VIEWER)
        return Role.OPERATOR

    def identify(self, request: Request) -> Person | Response:
        """Who sent ``request``, or the 401 (403) that asks them who they are (refuses them)."""
        if not self.known:
            return ANYONE
        if self.user_header:
            if request.remote_addr not in self.proxies:
                return Response(f"requests from {request.remote_addr} do not come through the dashboard's proxy "
                                "(--proxy-addresses)\n", 403)
            name = request.headers.get(self.user_header, "").strip()
            if not name:
                return Response(f"no user in the {self.user_header} header: reach the dashboard through its proxy\n",
                                401)
            return Person(name, self.role_of(name))
        given = request.authorization
        if given is not None and given.type == "basic":
            sent_user, sent_password = str(given.username).encode(), str(given.password).encode()
            for user, password in self.basic_auth:  # as bytes: a name outside ASCII compares too
                if hmac.compare_digest(sent_user, user.encode()) and hmac.compare_digest(sent_password,
                                                                                         password.encode()):
                    return Person(user, self.role_of(user))
        return Response("credentials required\n", 401, {"WWW-Authenticate": 'Basic realm="sas dashboard"'})
