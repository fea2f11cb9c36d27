"""Submitting many runs at once: one transaction for the batch, each item judged on its own."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from sas_app import DuplicateBusinessKey, InvalidSubmission, SasApp, Step, Submission, UnknownWorkflow
from sas_app.store.tables import outbox
from tests.unit.test_submit import counts
from workers.orders import install

# On SQLite here and, as integration tests, on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.both_stores


class Refused(Exception):
    pass


@pytest.fixture
def shop(settings):
    app = SasApp(settings)
    install(app)
    noop = app.agent("noop")

    @noop.action
    def nothing(call: Any) -> dict[str, Any]:
        return {}

    def refuse_some(conn: Any, run: Any) -> None:
        if run.payload.get("refuse"):
            raise Refused(run.business_key)

    app.workflow("hooked", [Step("only", nothing)], on_submit=refuse_some)
    app.migrate()
    yield app
    app.store.dispose()


def test_a_batch_writes_its_good_items_once_each_and_reports_the_bad_ones_in_place(shop):
    outcomes = shop.submit_many([
        Submission("order", {"amount": 1}, "B-1"),
        {"workflow": "order", "payload": {"amount": -1}, "business_key": "B-2"},  # bad payload
        Submission("nope", {"amount": 1}, "B-3"),  # unknown workflow
        Submission("order", {"amount": 2}, "B-4", priority=9),
        Submission("order", {"amount": 1}, "B-1"),  # the first item again: the same run
        Submission("order", {"amount": 7}, "B-4"),  # B-4 again with another payload
        {"workflow": "order", "payload": {"amount": 3}},  # no business key
        Submission("order", {"amount": 3}, "B-5", reply_to="batch-replies"),
    ])

    assert [o.index for o in outcomes] == list(range(8))
    assert [o.ok for o in outcomes] == [True, False, False, True, True, False, False, True]
    assert isinstance(outcomes[1].error, InvalidSubmission) and "positive 'amount'" in str(outcomes[1].error)
    assert isinstance(outcomes[2].error, UnknownWorkflow) and "'nope'" in str(outcomes[2].error)
    assert isinstance(outcomes[5].error, DuplicateBusinessKey) and "item 3 of this batch" in str(outcomes[5].error)
    assert isinstance(outcomes[6].error, InvalidSubmission) and "business_key" in str(outcomes[6].error)
    first, again = outcomes[0].handle, outcomes[4].handle
    assert (first.created, again.created, again.id) == (True, False, first.id)
    assert counts(shop) == {"runs": 3, "steps": 15, "events": 3, "orders": 3}
    view = outcomes[3].handle.status()
    assert (view.run.business_key, view.run.priority, view.run.payload) == ("B-4", 9, {"amount": 2})
    assert [s.state for s in view.steps] == ["not_started"] * 5
    with shop.store.engine.connect() as conn:  # B-5's notification, written with it
        assert conn.execute(select(outbox.c.reply_to, outbox.c.body)).one()[0] == "batch-replies"


def test_keys_the_store_already_holds_give_their_run_or_a_clear_refusal(shop):
    held = shop.submit("order", {"amount": 5}, business_key="C-1")
    other = shop.submit("order", {"amount": 7}, business_key="C-2")

    outcomes = shop.submit_many([Submission("order", {"amount": 5}, "C-1"),
                                 Submission("order", {"amount": 6}, "C-3"),
                                 Submission("order", {"amount": 9}, "C-2")])

    assert (outcomes[0].handle.id, outcomes[0].handle.created) == (held.id, False)
    assert outcomes[1].handle.created
    assert isinstance(outcomes[2].error, DuplicateBusinessKey) and f"already names run {other.id}" in str(
        outcomes[2].error)
    assert counts(shop)["runs"] == 3 and counts(shop)["orders"] == 3


def test_a_failure_inside_the_batch_writes_nothing_of_it(shop):
    before = counts(shop)
    batch = [Submission("hooked", {"n": i, "refuse": i == 7}, f"H-{i}") for i in range(10)]
    with pytest.raises(Refused, match="H-7"):
        shop.submit_many(batch)
    assert counts(shop) == before

    # the same batch, fixed, goes in whole
    outcomes = shop.submit_many([Submission("hooked", {"n": i}, f"H-{i}") for i in range(10)])
    assert all(o.ok and o.handle.created for o in outcomes)
    assert counts(shop)["runs"] == before["runs"] + 10


def test_an_empty_batch_is_nothing(shop):
    assert shop.submit_many([]) == []
    assert counts(shop) == {"runs": 0, "steps": 0, "events": 0, "orders": 0}
