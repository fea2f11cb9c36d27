"""Submitting from Python: good input becomes one run, bad input is refused and writes nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from sas_app import DuplicateBusinessKey, InvalidSubmission, SasApp, UnknownRun, UnknownWorkflow
from sas_app.store.tables import events, runs, steps
from workers.orders import install, orders

# On SQLite here and, as integration tests, on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.both_stores


@pytest.fixture
def shop(settings):
    app = SasApp(settings)
    install(app)
    app.migrate()
    yield app
    app.store.dispose()


def counts(app: SasApp) -> dict[str, int]:
    with app.store.engine.connect() as conn:
        return {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                for t in (runs, steps, events, orders)}


NOTHING = {"runs": 0, "steps": 0, "events": 0, "orders": 0}


def test_submit_writes_the_run_its_steps_and_the_order_row_together(shop):
    handle = shop.submit("order", {"amount": 12.5}, business_key="A-1")

    assert counts(shop) == {"runs": 1, "steps": 5, "events": 1, "orders": 1}
    view = handle.status()
    assert (view.process_state, view.run.business_key, view.run.failure_count) == ("pending", "A-1", 0)
    assert view.run.locked_by is None and view.run.complete_by is not None
    assert [s.state for s in view.steps] == ["not_started"] * 5
    assert len({s.idempotency_key for s in view.steps}) == 5


@pytest.mark.parametrize(
    ("workflow", "payload", "key", "error", "problem"),
    [
        ("nope", {"amount": 1}, "k", UnknownWorkflow, "unknown workflow 'nope'"),
        ("order", {"amount": 1, "when": object()}, "k", InvalidSubmission, "not JSON-serialisable"),
        ("order", {"amount": float("nan")}, "k", InvalidSubmission, "not JSON-serialisable"),
        ("order", [1, 2], "k", InvalidSubmission, "must be a JSON object"),
        ("order", {"amount": 1}, "", InvalidSubmission, "business_key must be a non-empty string"),
        ("order", {"amount": 1}, None, InvalidSubmission, "business_key must be a non-empty string"),
        ("order", {"amount": 1}, "x" * 201, InvalidSubmission, "at most 200"),
        ("order", {"amount": 1}, "line\nbreak", InvalidSubmission, "printable"),
        ("order", {"amount": 1, "blob": "x" * 300_000}, "k", InvalidSubmission, "over the 262144-byte limit"),
        ("order", {"amount": -3}, "k", InvalidSubmission, "positive 'amount'"),
        ("order", {}, "k", InvalidSubmission, "positive 'amount'"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error_and_nothing_is_written(shop, workflow, payload, key, error, problem):
    with pytest.raises(error, match=problem.replace("(", r"\(")):
        shop.submit(workflow, payload, business_key=key)
    assert counts(shop) == NOTHING


def test_the_same_business_key_returns_the_existing_run(shop):
    first = shop.submit("order", {"amount": 5}, business_key="A-2")
    again = shop.submit("order", {"amount": 5}, business_key="A-2")

    assert (again.id, again.created) == (first.id, False)
    assert counts(shop)["runs"] == 1 and counts(shop)["orders"] == 1


def test_the_same_business_key_with_another_payload_is_refused(shop):
    first = shop.submit("order", {"amount": 5}, business_key="A-3")
    with pytest.raises(DuplicateBusinessKey, match=f"already names run {first.id}"):
        shop.submit("order", {"amount": 6}, business_key="A-3")
    assert counts(shop)["runs"] == 1


def test_a_business_key_with_quotes_and_sql_is_stored_verbatim(shop):
    key = "x'); DROP TABLE runs; --\"%_"
    handle = shop.submit("order", {"amount": 1}, business_key=key)
    assert shop.store.find_run("order", key).id == handle.id
    assert counts(shop)["runs"] == 1


def test_an_unknown_run_id_is_a_clear_error(shop):
    with pytest.raises(UnknownRun, match="no run with id 'nope'"):
        shop.get_run("nope")


def test_wait_times_out_naming_the_state(shop):
    handle = shop.submit("order", {"amount": 1}, business_key="A-4")
    with pytest.raises(TimeoutError, match=r"still pending after 0\.2s"):
        handle.wait(0.2)
