"""Agents' rate limits in the state store (:class:`sas_app.agents.rate_limit.Slots`), for a
deployment whose broker is not Redis: one row per limit holding when its next free slot starts
(the database's clock), and one per limit with refused calls holding its line's next turn. A
reservation is one UPSERT that moves the slot on only when it starts soon enough (and, when the
schedule was idle, a DELETE of the line, whose turns nobody is coming back for); a refused one
reads where the schedule ends and takes the line's next turn with a second UPSERT."""

from __future__ import annotations

from sqlalchemy import Engine, delete, func, select

from sas_app.store.connection import db_now, dialect_insert
from sas_app.store.service_tables import rate_limits

#: how every limit's key starts (:meth:`sas_app.agents.rate_limit.RateLimit.name`)
PREFIX = "sas:rate:"


def line_of(key: str) -> str:
    """Where the line of ``key``'s turned-away calls is kept, in Redis or here: a name no limit's
    key has, whatever a tenant's key holds (``eu:line`` is a tenant, never a line)."""
    return "sas:rate-line:" + key.removeprefix(PREFIX)


class StoreSlots:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        postgres = engine.dialect.name == "postgresql"
        self._insert = dialect_insert(engine.dialect.name)
        self._greatest = func.greatest if postgres else func.max

    def reserve(self, key: str, interval: float, horizon: float) -> tuple[bool, float]:
        free = self._greatest(rate_limits.c.next_at, db_now())
        upsert = self._insert(rate_limits).values(key=key, next_at=db_now() + interval)
        upsert = upsert.on_conflict_do_update(index_elements=["key"], set_={"next_at": free + interval},
                                              where=free - db_now() <= horizon)
        with self.engine.begin() as conn:
            reserved = conn.execute(upsert.returning(rate_limits.c.next_at - interval - db_now())).scalar()
            if reserved is not None:
                if reserved <= 0:  # the schedule was idle: a line left from a burst is stale
                    conn.execute(delete(rate_limits).where(rate_limits.c.key == line_of(key)))
                return True, max(float(reserved), 0.0)
            free_at = conn.execute(select(rate_limits.c.next_at).where(rate_limits.c.key == key)).scalar()
            at = self._greatest(free_at if free_at is not None else 0.0, db_now())
            turn = self._insert(rate_limits).values(key=line_of(key), next_at=at + interval)
            turn = turn.on_conflict_do_update(index_elements=["key"],
                                              set_={"next_at": self._greatest(rate_limits.c.next_at, at) + interval})
            wait = conn.execute(turn.returning(rate_limits.c.next_at - interval - db_now())).scalar()
            return False, max(float(wait or 0.0), 0.0)
