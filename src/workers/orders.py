"""The pattern's example: e-commerce order processing.

``submit`` writes the order row and the run in one transaction (the pattern's submission
process). The workflow then reserves the order's items at the warehouse (agent ``warehouse``)
while the payment provider's risk API checks it for fraud (agent ``fraud``); once both are done
it charges the customer at the payment service (agent ``payment``), schedules one shipment per
reserved item (up to five at once), and confirms the order in the orders database (agent
``orders``). A held order (``held_order``) waits, after the reservation and the fraud check, for
a manager's review (the signal ``review``) and then a cooling-off period before the charge. Each
remote effect has an undo — release the stock, refund the charge, cancel a shipment — run
last-first if the order cannot complete.

The payload: ``{"amount": 12.5, "items": [{"sku": "A1", "qty": 2}, ...]}``; without ``items`` the
order is one item.

Faults for a demo or a test ride in the payload: ``{"faults": {"charge": "transient:2"}}`` sends
that fault spec (see workers.remote_service) with every request of that action (for ``ship``, of
the first shipment). One fault acts in
the agent instead: ``"poison"`` kills the worker process running the step, on every attempt, before
any request is sent (a step that crashes whatever runs it).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import httpx
from celery.signals import worker_process_init
from sqlalchemy import Column, Connection, Double, MetaData, String, Table, insert, update

from sas_app import (
    AgentCall,
    InvalidSubmission,
    PermanentError,
    RunRow,
    SasApp,
    Sleep,
    StaleAttempt,
    Step,
    TransientError,
    UndoCall,
    WaitFor,
    Workflow,
)

metadata = MetaData()
orders = Table(
    "orders",
    metadata,
    Column("order_id", String(200), primary_key=True),
    Column("run_id", String(32), nullable=False),
    Column("amount", Double, nullable=False),
    Column("status", String(20), nullable=False),
    Column("charge_id", String(100)),
)

ORDER_WORKFLOW = "order"
HELD_ORDER_WORKFLOW = "held_order"
SERVICES = {"payment": ("PAYMENT_SERVICE_URL", 8765), "warehouse": ("WAREHOUSE_SERVICE_URL", 8766)}

#: the agent action that undoes each remote action, as a payload's "faults" names it
UNDO_NAMES = {"charge": "refund", "reserve": "release", "ship": "cancel_shipment"}

_local = threading.local()


def service_url(service: str) -> str:
    variable, port = SERVICES[service]
    return os.environ.get(variable, f"http://127.0.0.1:{port}")


def _http() -> httpx.Client:
    # One connection pool per thread of each worker process (created after the fork).
    client: httpx.Client | None = getattr(_local, "client", None)
    if client is None:
        client = _local.client = httpx.Client()
    return client


@worker_process_init.connect
def _open_client(**_: Any) -> None:
    """A pool process opens its client as it starts, not at its first call: building one takes
    long enough that a first call made with it reaches the service late, bunched with the next
    process's on-time one — past a rate limit, for the service."""
    _http()


def call_service(service: str, verb: str, action: str, call: AgentCall) -> dict[str, Any]:
    """One request to a remote service, its outcome mapped onto the agent's retry policy."""
    fault_name = UNDO_NAMES[action] if verb == "undo" else action
    # a fault for a step that ships each item hits the first shipment (and its undo) only
    first = call.index in (None, 0) and (call.undoes is None or not call.undoes.step.endswith("]")
                                         or call.undoes.step.endswith("[0]"))
    fault = (call.payload.get("faults") or {}).get(fault_name) if first else None
    if fault == "poison":
        os.kill(os.getpid(), signal.SIGKILL)
    body: dict[str, Any] = {
        "order_id": call.business_key,
        "amount": call.payload.get("amount"),
        "fault": fault,
    }
    if verb == "undo":
        assert call.undoes is not None, "an undo is dispatched with the step it undoes"
        body["do_key"] = call.undoes.idempotency_key
    response = _http().post(
        f"{service_url(service)}/{verb}/{action}",
        json=body,
        headers=call.headers(),
        timeout=max(0.05, min(call.remaining(), 10.0)),
    )
    if response.status_code == 409:
        raise StaleAttempt(f"{service} refused {verb} {action}: {response.json().get('error')}")
    if response.status_code >= 500 or response.status_code == 429:
        raise TransientError(f"{service} answered {response.status_code}: {_error_of(response)}")
    if response.status_code >= 400:
        raise PermanentError(f"{service} refused {action}: {_error_of(response)}")
    data: dict[str, Any] = response.json()
    return {"effect_id": data["effect_id"]}


def _error_of(response: httpx.Response) -> str:
    """What a service said went wrong: its JSON ``error``, or the start of its body."""
    try:
        return str(response.json().get("error") or response.status_code)
    except ValueError:
        return response.text[:200] or str(response.status_code)


def record_order(conn: Connection, run: RunRow) -> None:
    """``on_submit``: the order row, in the same transaction as the run."""
    amount = run.payload.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount <= 0:
        raise InvalidSubmission(f"order payload needs a positive 'amount', got {amount!r}")
    items = run.payload.get("items", [])
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise InvalidSubmission(f"order payload's 'items' must be a list of objects, got {items!r}")
    conn.execute(
        insert(orders).values(order_id=run.business_key, run_id=run.id, amount=amount, status="received")
    )


def install(
    sas: SasApp, *, charge_timeout: float = 10.0, max_failures: int = 3, step_timeout: float = 10.0,
    review_timeout: float = 3600.0, cool_off: float = 1.0,
) -> Workflow:
    """Register the order example's agents and workflows on ``sas`` (``charge_timeout`` for the
    payment step, ``step_timeout`` for the others; for a held order, how long its manager has and
    its cooling-off period). Returns the order workflow."""
    sas.register_tables(metadata)
    payment = sas.agent("payment")
    fraud = sas.agent("fraud")  # the payment provider's risk API: its own queue, slots and breaker
    warehouse = sas.agent("warehouse")
    order_db = sas.agent("orders")

    @warehouse.action
    def reserve(call: AgentCall) -> dict[str, Any]:
        reserved = call_service("warehouse", "do", "reserve", call)
        return {**reserved, "items": call.payload.get("items") or [{"sku": "item", "qty": 1}]}

    @fraud.action
    def check(call: AgentCall) -> dict[str, Any]:
        return call_service("payment", "check", "check_fraud", call)

    @warehouse.undo
    def release(call: UndoCall) -> dict[str, Any]:
        return call_service("warehouse", "undo", "reserve", call)

    @payment.action
    def charge(call: AgentCall) -> dict[str, Any]:
        return call_service("payment", "do", "charge", call)

    @payment.undo
    def refund(call: UndoCall) -> dict[str, Any]:
        return call_service("payment", "undo", "charge", call)

    @warehouse.action
    def ship(call: AgentCall) -> dict[str, Any]:
        return call_service("warehouse", "do", "ship", call)

    @warehouse.undo
    def cancel_shipment(call: UndoCall) -> dict[str, Any]:
        return call_service("warehouse", "undo", "ship", call)

    @order_db.action
    def confirm(call: AgentCall) -> dict[str, Any]:
        charge_id = call.result_of("charge_payment")["effect_id"]
        with sas.store.engine.begin() as conn:
            conn.execute(
                update(orders)
                .where(orders.c.order_id == call.business_key)
                .values(status="paid", charge_id=charge_id)
            )
        return {"status": "paid"}

    reserving = Step("reserve_stock", reserve, timeout=step_timeout, max_failures=max_failures, compensate=release)
    checking = Step("fraud_check", check, timeout=step_timeout, max_failures=max_failures, after=[])  # beside it
    charging = Step("charge_payment", charge, timeout=charge_timeout, max_failures=max_failures, compensate=refund,
                    after=[reserving, checking])  # the join
    shipping = Step("schedule_shipping", ship, timeout=step_timeout, max_failures=max_failures,
                    compensate=cancel_shipment, for_each=reserving.output("items"), max_parallel=5)
    confirming = Step("confirm_order", confirm, timeout=step_timeout, max_failures=max_failures)
    order = sas.register(Workflow(
        ORDER_WORKFLOW, [reserving, checking, charging, shipping, confirming], on_submit=record_order,
        description="reserve stock while checking for fraud, charge the customer, ship each item, confirm the order",
    ))
    # A large order is held: once its stock is reserved and its fraud check done, a manager reviews
    # it (the signal 'review'; none within review_timeout and the order is undone), then a
    # cooling-off period passes before the customer is charged.
    review = WaitFor("manager_review", "review", timeout=review_timeout, after=[reserving, checking])
    cooling_off = Sleep("cool_off", seconds=cool_off)
    charging_after = Step("charge_payment", charge, timeout=charge_timeout, max_failures=max_failures,
                          compensate=refund)
    sas.register(Workflow(
        HELD_ORDER_WORKFLOW, [reserving, checking, review, cooling_off, charging_after, shipping, confirming],
        on_submit=record_order,
        description="a large order: reviewed by a manager, then a cooling-off period, then charged and shipped",
    ))
    return order
