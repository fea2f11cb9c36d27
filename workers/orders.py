"""The pattern's example: e-commerce order processing.

``submit`` writes the order row and the run in one transaction (the pattern's submission
process). The workflow then charges the customer through the remote payment service (agent
``payment``) and confirms the order in the orders database (agent ``orders``).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import httpx
from sqlalchemy import Column, Connection, Double, MetaData, String, Table, insert, update

from sas_app import (
    AgentCall,
    InvalidSubmission,
    PermanentError,
    SasApp,
    StaleAttempt,
    Step,
    TransientError,
    Workflow,
)
from sas_app.store import RunRow

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


def payment_url() -> str:
    return os.environ.get("PAYMENT_SERVICE_URL", "http://127.0.0.1:8765")


_local = threading.local()


def _http() -> httpx.Client:
    # One connection pool per thread of each worker process (created after the fork).
    client: httpx.Client | None = getattr(_local, "client", None)
    if client is None:
        client = _local.client = httpx.Client()
    return client


def record_order(conn: Connection, run: RunRow) -> None:
    """``on_submit``: the order row, in the same transaction as the run."""
    amount = run.payload.get("amount")
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount <= 0:
        raise InvalidSubmission(f"order payload needs a positive 'amount', got {amount!r}")
    conn.execute(
        insert(orders).values(order_id=run.business_key, run_id=run.id, amount=amount, status="received")
    )


def install(sas: SasApp, *, charge_timeout: float = 10.0, max_failures: int = 3) -> Workflow:
    """Register the order example's agents and workflow on ``sas``."""
    sas.register_tables(metadata)
    payment = sas.agent("payment")
    order_db = sas.agent("orders")

    @payment.action
    def charge(call: AgentCall) -> dict[str, Any]:
        body = {
            "order_id": call.business_key,
            "amount": call.payload["amount"],
            "fault": (call.payload.get("faults") or {}).get("charge"),
        }
        response = _http().post(
            f"{payment_url()}/charges",
            json=body,
            headers=call.headers(),
            timeout=max(0.05, min(call.remaining(), 10.0)),
        )
        if response.status_code == 409:
            raise StaleAttempt(f"payment service saw a newer attempt than {call.attempt}")
        if response.status_code >= 500 or response.status_code == 429:
            raise TransientError(f"payment service answered {response.status_code}")
        if response.status_code >= 400:
            raise PermanentError(f"payment refused: {response.json().get('error', response.status_code)}")
        data = response.json()
        return {"charge_id": data["charge_id"]}

    @order_db.action
    def confirm(call: AgentCall) -> dict[str, Any]:
        charge_id = call.results["charge_payment"]["charge_id"]
        with sas.store.engine.begin() as conn:
            conn.execute(
                update(orders)
                .where(orders.c.order_id == call.business_key)
                .values(status="paid", charge_id=charge_id)
            )
        return {"status": "paid"}

    return sas.register(
        Workflow(
            ORDER_WORKFLOW,
            [
                Step("charge_payment", charge, timeout=charge_timeout, max_failures=max_failures),
                Step("confirm_order", confirm, timeout=10.0, max_failures=max_failures),
            ],
            on_submit=record_order,
            description="charge the customer, then confirm the order",
        )
    )
