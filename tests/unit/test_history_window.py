"""What periodic looks read of a window of the history, found by the events' primary key rather
than by reading every event: ``sas doctor``'s attempts that left ``running`` twice (which the
fencing token rules out, so one found is a bug to report), and an agent's recent completions (the
pace the at-risk look and the retries' pacing read). On SQLite here and, as integration tests, on
PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import insert

from sas_app.store.history import first_event_since
from sas_app.store.tables import events
from tests.support import pass_time

pytestmark = pytest.mark.both_stores


def end_again(sas, run_id: str) -> None:
    """The end of the run's first step's attempt written a second time, as a fencing bug would."""
    at = sas.store.now()
    with sas.store.engine.begin() as conn:
        conn.execute(insert(events).values(run_id=run_id, position=0, kind="transition", from_state="running",
                                           to_state="completed", attempt=1, actor="a bug", at=at))


def test_an_attempt_ended_twice_is_found_in_the_window_asked_for(sas, pump):
    old = sas.submit("three", {}, business_key="old")
    pump.run()
    end_again(sas, old.id)
    start = sas.store.now()
    pass_time(sas, start + 7200, "two hours")
    recent = [sas.submit("three", {}, business_key=f"new-{i}") for i in range(25)]
    pump.run()
    end_again(sas, recent[12].id)

    found = sas.store.attempts_ended_twice(3600)
    assert (found.count, found.example) == (1, recent[12].id)
    assert sas.store.attempts_ended_twice(86400).count == 2
    pass_time(sas, sas.store.now() + 7200, "two more hours")
    assert sas.store.attempts_ended_twice(3600).count == 0


def test_the_first_event_of_a_window_is_found_by_its_key(sas, pump):
    with sas.store.engine.connect() as conn:
        assert first_event_since(conn, 3600) is None  # no history at all
    sas.submit("three", {}, business_key="before")
    pump.run()
    pass_time(sas, sas.store.now() + 100, "a while")
    sas.submit("three", {}, business_key="after")
    pump.run()
    moment = sas.store.now() - 50
    with sas.store.engine.connect() as conn:
        ids_and_times = conn.execute(events.select().with_only_columns(events.c.id, events.c.at)
                                     .order_by(events.c.id)).all()
        expected = min(i for i, at in ids_and_times if at >= moment)
        assert first_event_since(conn, 50) == expected
        assert first_event_since(conn, 10_000) == ids_and_times[0][0]
    pass_time(sas, sas.store.now() + 100, "the history to age")
    with sas.store.engine.connect() as conn:
        assert first_event_since(conn, 50) is None


def test_an_agents_recent_completions_are_those_of_the_window_newest_first(sas, pump):
    sas.submit("three", {}, business_key="long-ago")
    pump.run()
    pass_time(sas, sas.store.now() + 600, "ten minutes")
    for i in range(3):
        sas.submit("three", {}, business_key=f"now-{i}")
        pump.run()
        pass_time(sas, sas.store.now() + 1, "a second")

    with sas.store.begin() as tx:
        done, now = tx.sweep.recent_completions("svc", 60)
        few, _ = tx.sweep.recent_completions("svc", 60, most=4)
        nobody, _ = tx.sweep.recent_completions("nobody", 60)
    assert len(done) == 9 and done == sorted(done, reverse=True)  # three runs of three steps
    assert all(now - 60 <= t <= now for t in done)
    assert few == done[:4] and nobody == []
