"""Checkpoints of a reader of the events table (the dashboard's counters): the id of the last event
it counted and what it counted, one row per reader's name. What is counted up to an id is the
same for every replica that counts the same way, so the furthest checkpoint is kept — a save
moves it forward only — and a replica started later resumes from it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, delete, func, select

from sas_app.store.connection import db_now, dialect_insert
from sas_app.store.service_tables import checkpoints
from sas_app.store.tables import events


class CheckpointQueries:
    engine: Engine

    def checkpoint(self, name: str) -> tuple[int, Any] | None:
        """The last event's id and the state saved under ``name``, if any was. On SQLite, where an
        event's id is the table's largest plus one, a purge that deleted the newest events gives
        their ids to the next ones: a checkpoint past the newest event would skip those, and is
        deleted instead of returned (PostgreSQL's ids come from a sequence and are never reused)."""
        newest = select(func.max(events.c.id)).scalar_subquery()
        with self.engine.begin() as conn:
            row = conn.execute(select(checkpoints.c.last_id, checkpoints.c.state, newest.label("newest"))
                               .where(checkpoints.c.name == name)).first()
            if row is None:
                return None
            if self.engine.dialect.name == "sqlite" and (row.newest is None or row.last_id > row.newest):
                conn.execute(delete(checkpoints).where(checkpoints.c.name == name))
                return None
        return int(row.last_id), row.state

    def save_checkpoint(self, name: str, last_id: int, state: Any) -> None:
        """Save ``state`` as counted up to ``last_id``, unless a checkpoint further on is saved."""
        upsert = dialect_insert(self.engine.dialect.name)(checkpoints).values(
            name=name, last_id=last_id, state=state, at=db_now())
        upsert = upsert.on_conflict_do_update(
            index_elements=["name"], where=checkpoints.c.last_id < upsert.excluded.last_id,
            set_={"last_id": upsert.excluded.last_id, "state": upsert.excluded.state, "at": upsert.excluded.at})
        with self.engine.begin() as conn:
            conn.execute(upsert)
