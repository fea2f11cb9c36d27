"""A window of the history: where the events written in the last N seconds begin, found by the
events' primary key. ``events.at`` has no index (one would cost every event written), so a filter
on the time alone reads the whole history; bounded by the key, a query over the last hour or
minute reads that hour's or minute's events, however long the history kept."""

from __future__ import annotations

from sqlalchemy import Connection, func, select

from sas_app.store.connection import db_now
from sas_app.store.tables import events


def first_event_since(conn: Connection, since: float) -> int | None:
    """The id of the first event written in the last ``since`` seconds (None: none was), by a
    binary search of the primary key: ids grow as events are written, and so, but for the moments
    concurrent transactions overlap, do their times. An event's time is when its statement began,
    never after its id was taken, so an event that waited (for a lock) may be found after the
    window's start: a window may miss its first moments, never reach before them. Some sixty
    look-ups by key at most."""
    # two subqueries: SQLite reads min and max from the index only one at a time
    low, high = conn.execute(select(select(func.min(events.c.id)).scalar_subquery(),
                                    select(func.max(events.c.id)).scalar_subquery())).one()
    if high is None:
        return None
    moment = float(conn.execute(select(db_now() - since)).scalar_one())

    def at_or_after(position: int) -> tuple[int, float] | None:
        """The first event from ``position`` on (None: none, a purge having deleted them since)."""
        row = conn.execute(select(events.c.id, events.c.at).where(events.c.id >= position)
                           .order_by(events.c.id).limit(1)).first()
        return None if row is None else (int(row.id), float(row.at))

    def recent(position: int) -> bool:
        found = at_or_after(position)
        return found is None or found[1] >= moment

    last = at_or_after(high)
    if last is None or last[1] < moment:
        return None
    while low < high:  # the first position whose next event is recent enough
        middle = (low + high) // 2
        if recent(middle):
            high = middle
        else:
            low = middle + 1
    first = at_or_after(low)
    return None if first is None else first[0]
