"""Typed input: a workflow's pydantic model validates the payload on every way in — submit,
submit_many, the broker's sas.submit, a schedule, a child run, an operator's edited input — naming
every bad field and writing nothing; the action gets the parsed model; the dashboard shows its
JSON Schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field
from sqlalchemy import func, select

from sas_app import (
    AgentCall,
    ChildRun,
    InvalidOperation,
    InvalidSubmission,
    PermanentError,
    RunState,
    SasApp,
    Settings,
    Step,
    Workflow,
    WorkflowDefinitionError,
)
from sas_app.cli.main import main
from sas_app.interfaces.notifications import Notifications
from sas_app.messaging.routing import SCHEDULER_QUEUE, SUBMIT
from sas_app.store.tables import events, runs
from sas_app.testing import Environment
from sas_app.web.dashboard import create_dashboard
from tests.support import FakeClock


class Item(BaseModel):
    sku: str = Field(min_length=1)
    qty: int = Field(default=1, ge=1)


class Order(BaseModel):
    customer: str = Field(min_length=1)
    amount: float = Field(gt=0)
    items: list[Item] = Field(min_length=1)
    express: bool = False
    scheduled_for: str | None = None


GOOD = {"customer": "ann", "amount": 12.5, "items": [{"sku": "tea"}]}
BAD = {"customer": "", "amount": -3, "items": [{"qty": 0}]}
#: what BAD gets told: each bad field, by its path
BAD_FIELDS = ("customer: String should have at least 1 character; amount: Input should be greater than 0; "
              "items.0.sku: Field required; items.0.qty: Input should be greater than or equal to 1")


def install(sas: SasApp) -> dict[str, Any]:
    shop = sas.agent("shop")

    @shop.action
    def take(call: AgentCall) -> dict[str, Any]:
        order = call.payload
        if not isinstance(order, Order):
            raise PermanentError(f"the action got a {type(order).__name__}, not an Order")
        if order.customer == "refuses":
            raise PermanentError("this customer is refused")
        return {"customer": order.customer, "total": order.amount, "skus": [i.sku for i in order.items],
                "express": order.express}

    sas.register(Workflow("order", [Step("take", take, timeout=5)], input=Order))
    sas.register(Workflow("parent", [Step("first", take, timeout=5), ChildRun("child", "order")], input=Order))
    @shop.action
    def note(call: AgentCall) -> dict[str, Any]:
        return {"noted": type(call.payload).__name__}

    sas.register(Workflow("loose", [Step("note", note, timeout=5)]))  # no model: any object
    sas.register(Workflow("gift", [Step("note", note, timeout=5), ChildRun("child", "order")]))
    return {"take": take, "note": note}


@pytest.fixture
def shop(settings: Settings) -> Iterator[tuple[Environment, dict[str, Any]]]:
    user = SasApp(settings)
    actions = install(user)
    with Environment(user, clock=FakeClock()) as env:
        yield env, actions


def nothing_written(sas: SasApp) -> bool:
    with sas.store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(runs)).scalar() == 0 and \
            conn.execute(select(func.count()).select_from(events)).scalar() == 0


def test_a_valid_payload_is_stored_as_the_model_dumps_it_and_the_action_gets_the_model(shop):
    env, a = shop
    view = env.run("order", GOOD)

    assert view.state is RunState.PROCESSED, view.run.error
    assert view.run.payload == {**GOOD, "items": [{"sku": "tea", "qty": 1}], "express": False, "scheduled_for": None}
    assert view.step("take").result == {"customer": "ann", "total": 12.5, "skus": ["tea"], "express": False}
    [call] = env.calls(a["take"])
    assert isinstance(call.payload, Order) and call.payload.items[0].qty == 1


def test_submit_refuses_a_bad_payload_naming_every_bad_field_and_writes_nothing(shop):
    env, _ = shop
    with pytest.raises(InvalidSubmission) as refused:
        env.app.submit("order", BAD, business_key="bad-1")
    assert str(refused.value) == f"workflow 'order': the payload is not a valid Order: {BAD_FIELDS}"
    with pytest.raises(InvalidSubmission, match="the payload is not a valid Order: \\(the payload\\): Input should be"):
        env.app.submit("order", ["not", "an", "object"], business_key="bad-2")
    assert nothing_written(env.app)


def test_a_model_instance_may_be_submitted_as_the_payload(shop):
    env, _ = shop
    handle = env.app.submit("order", Order.model_validate(GOOD), business_key="as-model")
    assert env.finish(handle.id).state is RunState.PROCESSED


def test_submit_many_refuses_the_bad_item_in_place_and_writes_the_good_ones(shop):
    env, _ = shop
    outcomes = env.app.submit_many([
        {"workflow": "order", "payload": GOOD, "business_key": "m-1"},
        {"workflow": "order", "payload": BAD, "business_key": "m-2"},
        {"workflow": "order", "payload": {**GOOD, "customer": "bo"}, "business_key": "m-3"},
    ])
    assert [o.ok for o in outcomes] == [True, False, True]
    assert BAD_FIELDS in str(outcomes[1].error)
    assert sorted(r.business_key for r in env.app.store.list_runs()) == ["m-1", "m-3"]


def test_the_broker_s_sas_submit_refuses_a_bad_payload_on_reply_to_and_writes_nothing(shop):
    env, _ = shop
    with Notifications(env.app.celery, "replies") as inbox:
        env.app.celery.send_task(SUBMIT, queue=SCHEDULER_QUEUE, kwargs={
            "workflow": "order", "payload": BAD, "business_key": "by-message", "reply_to": "replies"})
        env.settle()
        answer = inbox.get(timeout=2)
    assert answer is not None and answer["kind"] == "refused" and BAD_FIELDS in answer["reason"]
    assert nothing_written(env.app)


def test_a_schedule_s_payload_is_validated_when_declared(shop):
    env, _ = shop
    with pytest.raises(WorkflowDefinitionError, match=r"schedule 'nightly'.*amount: Field required"):
        env.app.schedule("nightly", workflow="order", cron="0 2 * * *", payload={"customer": "ann", "items": []})
    assert "nightly" not in env.app.schedules.schedules
    declared = env.app.schedule("hourly", workflow="order", cron="0 * * * *", payload=GOOD)
    assert declared.payload == GOOD


def test_a_child_run_whose_input_does_not_validate_fails_its_step_and_the_parent_is_undone(shop):
    env, _ = shop
    view = env.run("gift", {"customer": "ann", "amount": 3, "items": []})  # "gift" takes anything; "order" not

    assert view.state is RunState.ERROR  # its one step before has no undo: left for an operator
    assert view.step("note").result == {"noted": "dict"}  # no model: the action gets the JSON object
    child = view.step("child")
    assert child.state == "failed" and "its child run's input: workflow 'order': the payload is not a valid Order: " \
        "items: List should have at least 1 item" in child.error
    assert env.app.store.children(view.id) == []  # no child run was written


def test_an_operator_s_edited_input_is_validated_and_the_action_gets_it_parsed(shop):
    env, a = shop
    view = env.run("order", {**GOOD, "customer": "refuses"})
    assert view.state is RunState.ERROR  # nothing to undo: left for an operator

    with pytest.raises(InvalidOperation, match=f"the edited input for run {view.id}: workflow 'order': "
                                               "the payload is not a valid Order: amount: Input should be"):
        env.app.resubmit(view.id, by="ops", reason="fix the customer", step_input={**GOOD, "amount": 0})
    assert env.get_run(view).state is RunState.ERROR  # nothing changed

    env.app.resubmit(view.id, by="ops", reason="fix the customer", step_input={**GOOD, "customer": "cy"})
    fixed = env.finish(view.id)
    assert fixed.state is RunState.PROCESSED
    assert fixed.step("take").input == {**GOOD, "customer": "cy", "items": [{"sku": "tea", "qty": 1}],
                                        "express": False, "scheduled_for": None}
    assert isinstance(env.calls(a["take"])[-1].payload, Order)


def test_an_input_that_is_not_a_pydantic_model_is_refused_at_registration(shop):
    env, _ = shop
    for bad in (dict, Order(**GOOD), "Order"):
        with pytest.raises(WorkflowDefinitionError, match="input must be a pydantic model class"):
            env.app.register(Workflow("typed_badly", [Step("take", "shop.take", timeout=5)], input=bad))  # type: ignore[arg-type]
    assert "typed_badly" not in env.app.workflows


def test_the_dashboard_shows_each_workflow_and_its_input_s_json_schema(shop):
    env, _ = shop
    client = create_dashboard(env.app).test_client()

    listed = client.get("/workflows").get_data(as_text=True)
    assert 'data-workflow="order"' in listed and ">Order</td>" in listed
    page = client.get("/workflows/order").get_data(as_text=True)
    schema = page.split('<pre id="input-schema">')[1].split("</pre>")[0]
    assert "&#34;exclusiveMinimum&#34;: 0" in schema and "&#34;required&#34;" in schema
    assert 'id="no-schema"' in client.get("/workflows/loose").get_data(as_text=True)
    assert client.get("/workflows/nope").status_code == 404


#: the app `sas workflows` loads here (``--app tests.unit.test_typed_input:LISTED``)
LISTED: SasApp | None = None


def test_sas_workflows_lists_each_workflow_with_its_input_s_json_schema(shop):
    global LISTED
    env, _ = shop
    LISTED = env.app

    listed = CliRunner().invoke(main, ["--app", "tests.unit.test_typed_input:LISTED", "workflows", "--json"])

    assert listed.exit_code == 0, listed.output
    rows = {row["name"]: row for row in json.loads(listed.output.splitlines()[-1])}
    assert rows["order"]["input"] == "Order" and rows["order"]["steps"] == ["take"]
    assert rows["order"]["input_schema"] == Order.model_json_schema()
    assert rows["loose"]["input"] is None and rows["loose"]["input_schema"] is None


class Aliased(BaseModel):
    customer_name: str = Field(alias="customerName", min_length=1)


def test_a_model_with_aliases_stores_its_payload_by_alias_and_the_action_reads_it_back(settings):
    user = SasApp(settings)
    crm = user.agent("crm")

    @crm.action
    def greet(call: AgentCall) -> dict[str, Any]:
        return {"hello": call.payload.customer_name}

    user.register(Workflow("greeting", [Step("greet", greet, timeout=5)], input=Aliased))
    with Environment(user, clock=FakeClock()) as env:
        view = env.run("greeting", {"customerName": "ann"})
        assert view.state is RunState.PROCESSED, view.run.error
        assert view.run.payload == {"customerName": "ann"}  # as its JSON Schema says
        assert view.step("greet").result == {"hello": "ann"}
