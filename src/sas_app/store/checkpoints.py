"""Checkpoints of a reader of the events table (the dashboard's counters): the id of the last event
it counted and what it counted, one row per reader's name. What is counted up to an id is the
same for every replica that counts the same way, so the furthest checkpoint is kept — a save
moves it forward only — and a replica started later resumes from it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, select

from sas_app.store.connection import db_now, dialect_insert
from sas_app.store.service_tables import checkpoints


class CheckpointQueries:
    engine: Engine

    def checkpoint(self, name: str) -> tuple[int, Any] | None:
        """The last event's id and the state saved under ``name``, if any was. An event's id is
        never given twice (PostgreSQL's sequence; SQLite's ``AUTOINCREMENT``), so events written
        after a purge of the newest ones are still past it."""
        with self.engine.connect() as conn:
            row = conn.execute(select(checkpoints.c.last_id, checkpoints.c.state)
                               .where(checkpoints.c.name == name)).first()
        return None if row is None else (int(row.last_id), row.state)

    def save_checkpoint(self, name: str, last_id: int, state: Any) -> None:
        """Save ``state`` as counted up to ``last_id``, unless a checkpoint further on is saved."""
        upsert = dialect_insert(self.engine.dialect.name)(checkpoints).values(
            name=name, last_id=last_id, state=state, at=db_now())
        upsert = upsert.on_conflict_do_update(
            index_elements=["name"], where=checkpoints.c.last_id < upsert.excluded.last_id,
            set_={"last_id": upsert.excluded.last_id, "state": upsert.excluded.state, "at": upsert.excluded.at})
        with self.engine.begin() as conn:
            conn.execute(upsert)
