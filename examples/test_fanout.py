"""The trip example, tested with sas_app's kit: the steps side by side, the fan-out and the join."""

from examples.fanout import assign_seat, book_flight, book_hotel, cancel, confirm, confirmation, sas, trip
from sas_app import PermanentError, RunState


def test_a_trip_books_flight_and_hotel_a_seat_per_traveller_then_confirms_once(sas_env):
    env = sas_env(sas)

    view = env.run(trip, {"travellers": ["ann", "bob", "cy", "dee"]})

    assert view.state is RunState.PROCESSED
    assert view.step(confirmation).result["seats"] == ["12A", "13A", "14A", "15A"]  # in the list's order
    assert sorted(call.item for call in env.calls(assign_seat)) == ["ann", "bob", "cy", "dee"]
    assert len(env.calls(confirm)) == 1  # the join runs once, after every branch and the hotel


def test_a_seat_that_cannot_be_had_cancels_the_flight_and_the_hotel(sas_env):
    env = sas_env(sas)
    env.stub(book_flight, returns={"flight": "FL-1"})  # no half-second wait: the story is the seat
    env.stub(book_hotel, returns={"hotel": "HT-1"})
    env.stub(assign_seat, raises=PermanentError("the plane is full"))

    view = env.run(trip, {"travellers": ["ann", "bob"]})

    assert view.state is RunState.COMPENSATED
    assert sorted(call.undoes.step for call in env.calls(cancel)) == ["book_flight", "book_hotel"]
    assert env.calls(confirm) == []
