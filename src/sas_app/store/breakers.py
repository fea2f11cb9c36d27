"""Agents' circuit breakers in the state store (:class:`sas_app.agents.breaker.SharedState`), for a
deployment whose broker is not Redis: a few keys per agent in ``breakers``, each write its own
short transaction. The breaker trusts a read for half a second; a success's reset of the failure
count is one UPDATE that changes no row while the count is zero."""

from __future__ import annotations

from sqlalchemy import Engine, Integer, String, cast, delete, select, update

from sas_app.store.connection import db_now, dialect_insert
from sas_app.store.service_tables import breakers


class StoreState:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._insert = dialect_insert(engine.dialect.name)

    def get(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(breakers.c.value).where(breakers.c.key == key)).scalar()

    def put(self, key: str, value: str) -> None:
        upsert = self._insert(breakers).values(key=key, value=value, expires_at=None)
        with self.engine.begin() as conn:
            conn.execute(upsert.on_conflict_do_update(index_elements=["key"],
                                                      set_={"value": value, "expires_at": None}))

    def incr(self, key: str) -> int:
        with self.engine.begin() as conn:
            missing = self._insert(breakers).values(key=key, value="0")
            conn.execute(missing.on_conflict_do_nothing(index_elements=["key"]))
            bumped = update(breakers).where(breakers.c.key == key).values(
                value=cast(cast(breakers.c.value, Integer) + 1, String)).returning(breakers.c.value)
            return int(conn.execute(bumped).scalar_one())

    def zero(self, key: str) -> None:
        with self.engine.begin() as conn:  # touches no row when it is zero already (every success)
            conn.execute(update(breakers).where(breakers.c.key == key, breakers.c.value != "0").values(value="0"))

    def release(self, key: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(breakers).where(breakers.c.key == key))

    def claim(self, key: str, value: str, seconds: float) -> bool:
        until = db_now() + seconds
        upsert = self._insert(breakers).values(key=key, value=value, expires_at=until)
        upsert = upsert.on_conflict_do_update(index_elements=["key"], set_={"value": value, "expires_at": until},
                                              where=breakers.c.expires_at < db_now())
        with self.engine.begin() as conn:
            return conn.execute(upsert.returning(breakers.c.key)).first() is not None
