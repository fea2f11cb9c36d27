"""Steps side by side, a fan-out and a join: a trip is booked flight and hotel at once, then one
seat per traveller (up to three at a time), then confirmed once everything is in.

Run it (with SAS_* set as for any sas_app process):
    SAS_APP=examples.fanout:sas sas worker &
    SAS_APP=examples.fanout:sas sas beat &
    python -m examples.fanout ann bob cy
"""

from __future__ import annotations

import sys
import time

from sas_app import AgentCall, SasApp, Step, UndoCall, Workflow

sas = SasApp()
celery = sas.celery
travel = sas.agent("travel")


@travel.action
def book_flight(call: AgentCall) -> dict[str, str]:
    time.sleep(0.5)  # a slow remote call: the hotel is booked meanwhile
    return {"flight": f"FL-{call.run_id[:6]}"}


@travel.action
def book_hotel(call: AgentCall) -> dict[str, str]:
    time.sleep(0.5)
    return {"hotel": f"HT-{call.run_id[:6]}"}


@travel.undo
def cancel(call: UndoCall) -> dict[str, str]:
    return {"cancelled": call.undoes.step}


@travel.action
def assign_seat(call: AgentCall) -> dict[str, str]:
    # One branch per traveller: call.item is this branch's element of the list, call.index its place.
    return {"traveller": call.item, "seat": f"{12 + call.index}A"}


@travel.action
def confirm(call: AgentCall) -> dict[str, object]:
    seats = call.result_of(seating)  # every branch's result, in the list's order
    return {"flight": call.result_of(flight)["flight"], "hotel": call.result_of(hotel)["hotel"],
            "seats": [s["seat"] for s in seats]}


flight = Step("book_flight", book_flight, timeout=10, compensate=cancel)
hotel = Step("book_hotel", book_hotel, timeout=10, compensate=cancel, after=[])  # beside the flight
seating = Step("assign_seats", assign_seat, timeout=10, for_each="travellers", max_parallel=3, after=[flight])
confirmation = Step("confirm", confirm, timeout=10, after=[seating, hotel])  # the join
trip = sas.register(Workflow("trip", [flight, hotel, seating, confirmation]))

if __name__ == "__main__":
    travellers = sys.argv[1:] or ["ann", "bob", "cy"]
    handle = sas.submit(trip, {"travellers": travellers}, business_key="trip-" + "-".join(travellers))
    view = handle.wait(timeout=60)
    confirmed = view.step("confirm").result or {}
    print(view.state, "flight", confirmed.get("flight"), "hotel", confirmed.get("hotel"),
          "seats", confirmed.get("seats"))
