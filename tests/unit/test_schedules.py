"""Scheduled starts on the injected clock: one run per tick however often beat asks, ticks missed
within the catch-up window started once each (older ones skipped), the overlap policies, and
schedules that cannot be refused when declared."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, String, Table, insert, select

from sas_app import Step, Workflow
from sas_app.errors import InvalidSubmission, WorkflowDefinitionError


def at(sas, moment: str) -> None:
    sas.test_clock.now = datetime.fromisoformat(moment).timestamp()


def test_each_tick_starts_exactly_one_run(sas, pump):
    at(sas, "2026-11-24T01:59:00+00:00")
    sas.schedule("nightly", workflow="three", cron="0 2 * * *", payload={"ledger": "eu"})
    assert sas.schedules.tick() == []  # first seen now: no run for ticks before it existed
    at(sas, "2026-11-24T02:00:00.300+00:00")
    [run_id] = sas.schedules.tick()
    assert sas.schedules.tick() == [] and sas.schedules.tick() == []  # beat asking again changes nothing
    run = sas.get_run(run_id).run
    assert (run.business_key, run.schedule) == ("nightly@2026-11-24T02:00:00Z", "nightly")
    assert run.payload == {"ledger": "eu", "scheduled_for": "2026-11-24T02:00:00Z"}
    pump.run()
    assert sas.get_run(run_id).process_state == "processed"
    at(sas, "2026-11-25T02:00:01+00:00")
    assert [sas.get_run(r).run.business_key for r in sas.schedules.tick()] == ["nightly@2026-11-25T02:00:00Z"]


def test_ticks_missed_within_the_catch_up_window_start_once_each(sas, pump):
    at(sas, "2026-11-24T00:30:00+00:00")
    sas.schedule("hourly", workflow="three", cron="0 * * * *", overlap="allow", catch_up=timedelta(hours=2))
    sas.schedules.tick()
    at(sas, "2026-11-24T05:30:00+00:00")  # beat was down for five ticks; two are inside the window
    keys = sorted(sas.get_run(r).run.business_key for r in sas.schedules.tick())
    assert keys == ["hourly@2026-11-24T04:00:00Z", "hourly@2026-11-24T05:00:00Z"]
    assert sas.schedules.tick() == []


@pytest.mark.parametrize("overlap, first_ends, second_starts", [
    ("skip", "processing", False),
    ("allow", "processing", True),
    ("cancel_previous", "cancelled", True),
])
def test_a_tick_while_the_previous_run_is_live(sas, pump, overlap, first_ends, second_starts):
    at(sas, "2026-11-24T10:00:30+00:00")
    sas.schedule("review", workflow="claim", cron="* * * * *", overlap=overlap)  # `claim` waits for a signal
    sas.schedules.tick()
    at(sas, "2026-11-24T10:01:00.1+00:00")
    [first] = sas.schedules.tick()
    pump.run()
    at(sas, "2026-11-24T10:02:00.1+00:00")
    second = sas.schedules.tick()
    pump.run()
    assert sas.get_run(first).process_state == first_ends
    assert bool(second) == second_starts
    if overlap == "cancel_previous":
        assert sas.get_run(first).step("undo:file").state == "completed"  # what it did was undone
    if overlap == "skip":
        sas.signal(first, "approval", {"approved": True})
        pump.run()
        at(sas, "2026-11-24T10:03:00.1+00:00")
        assert len(sas.schedules.tick()) == 1  # the run before has ended: this tick starts


@pytest.mark.parametrize("options, message", [
    ({"cron": "61 * * * *"}, "cron '61 \\* \\* \\* \\*' does not parse"),
    ({"cron": "every night"}, "does not parse"),
    ({"cron": "0 2 * * *", "workflow": "nope"}, "workflow 'nope' is not registered"),
    ({"cron": "0 2 * * *", "overlap": "queue"}, "overlap must be one of skip, allow, cancel_previous"),
    ({"cron": "0 2 * * *", "catch_up": -1}, "catch_up must be from 0 to"),
    ({"cron": "0 2 * * *", "payload": ["x"]}, "the payload must be a JSON object"),
])
def test_a_schedule_that_cannot_be_is_refused_when_declared(sas, options, message):
    with pytest.raises(WorkflowDefinitionError, match=message):
        sas.schedule("bad", **{"workflow": "three", **options})
    assert "bad" not in sas.schedules.schedules


def test_a_schedule_whose_payload_lacks_the_concurrency_key_is_refused(sas):
    sas.register(Workflow("per_desk", [Step("a", "svc.work")], concurrency_key="desk"))
    with pytest.raises(WorkflowDefinitionError, match="per 'desk': the payload needs that key"):
        sas.schedule("desk_check", workflow="per_desk", cron="0 * * * *")
    sas.schedule("desk_check", workflow="per_desk", cron="0 * * * *", payload={"desk": "d1"})
    with pytest.raises(WorkflowDefinitionError, match="already declared"):
        sas.schedule("desk_check", workflow="per_desk", cron="0 * * * *", payload={"desk": "d1"})


def test_a_tick_handled_late_by_the_beat_is_late_not_missed(sas, pump):
    at(sas, "2026-11-24T01:59:00+00:00")
    sas.schedule("strict", workflow="three", cron="0 2 * * *", catch_up=0)
    sas.schedules.tick()
    grace = sas.settings.pickup_timeout
    sas.test_clock.advance(60 + grace / 2)  # the beat came after the tick, within SAS_PICKUP_TIMEOUT
    assert [sas.get_run(r).run.business_key for r in sas.schedules.tick()] == ["strict@2026-11-24T02:00:00Z"]
    at(sas, "2026-11-25T02:00:00+00:00")
    sas.test_clock.advance(grace * 2)  # later than that, with no catch-up: missed
    assert sas.schedules.tick() == []


def test_a_scheduled_run_writes_what_its_workflow_s_on_submit_writes_and_a_refused_one_is_not_started(sas, pump):
    """A schedule's run is a submission like any other: its workflow's ``on_submit`` writes its
    rows in the same transaction; a tick it refuses starts nothing and is not asked again."""
    ledger = MetaData()
    entries = Table("ledger_entries", ledger, Column("key", String(200), primary_key=True))
    sas.register_tables(ledger)

    def write_entry(conn: Any, run: Any) -> None:
        if run.payload.get("closed"):
            raise InvalidSubmission("the ledger is closed")
        conn.execute(insert(entries).values(key=run.business_key))

    sas.workflow("booked", [Step("first", "svc.work", timeout=5)], on_submit=write_entry)
    at(sas, "2026-11-24T01:59:00+00:00")
    sas.schedule("nightly", workflow="booked", cron="0 2 * * *")
    sas.schedule("closed", workflow="booked", cron="0 2 * * *", payload={"closed": True})
    assert sas.schedules.tick() == []
    at(sas, "2026-11-24T02:00:00.300+00:00")

    [run_id] = sas.schedules.tick()
    assert sas.schedules.tick() == []  # the refused tick is handled, not asked again

    with sas.store.engine.connect() as conn:
        assert list(conn.execute(select(entries.c.key)).scalars()) == ["nightly@2026-11-24T02:00:00Z"]
    assert [r.business_key for r in sas.store.list_runs(workflow="booked")] == ["nightly@2026-11-24T02:00:00Z"]
    pump.run()
    assert sas.get_run(run_id).process_state == "processed"
