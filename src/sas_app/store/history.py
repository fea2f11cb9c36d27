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
    concurrent transactions overlap, do their times. Some sixty look-ups by key at most."""
    low, high = conn.execute(select(func.min(events.c.id), func.max(events.c.id))).one()
    if high is None:
        return None
    moment = conn.execute(select(db_now() - since)).scalar_one()

    def at_or_after(position: int) -> tuple[int, float]:
        row = conn.execute(select(events.c.id, events.c.at).where(events.c.id >= position)
                           .order_by(events.c.id).limit(1)).one()
        return int(row.id), float(row.at)

    if at_or_after(high)[1] < moment:
        return None
    while low < high:  # the first position whose next event is recent enough
        middle = (low + high) // 2
        if at_or_after(middle)[1] >= moment:
            high = middle
        else:
            low = middle + 1
    return at_or_after(low)[0]
