"""Rerunning after a fix: a run that ended is started again on the definition deployed now, from
a step — the steps it waits for keep their results (not called again), the rest run again — linked
both ways to the old run, which keeps its history; refused with the reason, nothing written, when
it cannot be. On SQLite and, as integration tests, on PostgreSQL."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from sas_app import (
    AgentCall,
    InvalidOperation,
    PermanentError,
    RunState,
    SasApp,
    Settings,
    Step,
    StepState,
    UndoCall,
    UnknownRun,
    Workflow,
)
from sas_app.cli.main import main
from sas_app.testing import Environment
from sas_app.web.dashboard import create_dashboard
from sas_app.web.people import parse_basic_auth
from tests.support import FakeClock

pytestmark = pytest.mark.both_stores

OPS = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}
#: the bug: the charge fails until the fix is "deployed" (FIXED["charge"] = True)
FIXED: dict[str, bool] = {}


def install(sas: SasApp) -> dict[str, Any]:
    shop = sas.agent("shop")

    @shop.action
    def work(call: AgentCall) -> dict[str, Any]:
        return {"step": call.step, "key": call.idempotency_key}

    @shop.action
    def charge(call: AgentCall) -> dict[str, Any]:
        if not FIXED.get("charge"):
            raise PermanentError("charge: division by zero (the bug)")
        return {"charged": call.payload["amount"]}

    @shop.undo
    def release(call: UndoCall) -> dict[str, Any]:
        return {"released": call.undoes.step}

    sas.register(Workflow("plain", [Step("note", work, timeout=5), Step("charge", charge, timeout=5),
                                    Step("ship", work, timeout=5)]))
    sas.register(Workflow("saga", [Step("reserve", work, timeout=5, compensate=release),
                                   Step("charge", charge, timeout=5), Step("ship", work, timeout=5)]))
    return {"work": work, "charge": charge, "release": release}


@pytest.fixture
def shop(settings: Settings, db_url: str) -> Iterator[tuple[Environment, dict[str, Any]]]:
    FIXED.clear()
    user = SasApp(settings)
    actions = install(user)
    with Environment(user, clock=FakeClock(), database_url=None if db_url.startswith("sqlite") else db_url) as env:
        yield env, actions
    FIXED.clear()


def test_a_run_in_error_is_rerun_from_its_failed_step_once_fixed_keeping_what_came_before(shop):
    env, a = shop
    old = env.run("plain", {"amount": 30}, business_key="o-1")
    assert old.state is RunState.ERROR  # nothing before the charge has an undo

    FIXED["charge"] = True  # the fix deployed
    handle = env.app.rerun(old.id, "charge", by="ops", reason="bug 123 fixed")
    new = env.finish(handle.id)

    assert new.state is RunState.PROCESSED
    assert new.run.rerun_of == old.id and new.run.rerun_from == "charge"
    assert env.get_run(old).run.rerun_as == new.id  # linked both ways
    assert new.run.business_key.startswith("o-1#rerun-") and new.run.payload == {"amount": 30}
    note = new.step("note")
    assert (note.state, note.result, note.idempotency_key) == (
        StepState.COMPLETED, old.step("note").result, old.step("note").idempotency_key)  # carried over
    assert [c.run_id for c in env.calls(a["work"]) if c.step == "note"] == [old.id]  # not called again
    assert new.step("charge").result == {"charged": 30}
    carried = [e for e in new.events if e.position == note.position]
    assert [(e.from_state, e.to_state, e.detail) for e in carried] == [
        ("not_started", "completed", {"carried_over_from": old.id})]
    kept = env.get_run(old)
    assert kept.state is RunState.ERROR and kept.step("charge").state == StepState.FAILED  # its history stands
    assert [(e.detail["action"], e.detail["rerun_as"]) for e in kept.events if e.kind == "operator"] == [
        ("rerun", new.id)]


def test_a_run_in_error_needs_someone_no_more_once_it_is_rerun(shop):
    """Its alert leaves the current ones, and the run the open runs' gauge: the new run carries on,
    and the old one refuses every action (an alert on sas_alerts_current would never clear)."""
    from sas_app.store.observe import Observer

    env, _ = shop
    observer = Observer(env.app.store)
    old = env.run("plain", {"amount": 30}, business_key="o-9")
    assert observer.current_alerts_by_kind() == [("failed", 1)]
    assert observer.open_runs_by_workflow_and_state() == [("plain", "error", 1)]
    assert [a.run_id for a in observer.alerts(10, current=True)] == [old.id]

    FIXED["charge"] = True
    new = env.finish(env.app.rerun(old.id, "charge", by="ops").id)
    assert new.state is RunState.PROCESSED
    assert observer.current_alerts_by_kind() == [] and observer.open_runs_by_workflow_and_state() == []
    assert observer.alerts(10, current=True) == []
    assert [a.run_id for a in observer.alerts(10, current=False)] == [old.id]
    dashboard = create_dashboard(env.app).test_client()
    overview = dashboard.get("/").get_data(as_text=True)  # its tile counts the runs someone must see to
    assert re.search(r'data-state="error"[^>]*><span>error</span><b>0</b>', overview)
    assert "1 more run in error was rerun and needs nobody" in overview
    listed = dashboard.get("/runs?state=error").get_data(as_text=True)
    assert f'class="muted rerun-as" href="/runs/{new.id}"' in listed


def test_a_compensated_run_is_rerun_from_its_first_undone_step_not_after_it(shop):
    env, a = shop
    old = env.run("saga", {"amount": 5}, business_key="s-1")
    assert old.state is RunState.COMPENSATED and old.step("reserve").state == StepState.COMPENSATED
    assert [c.undoes.step for c in env.calls(a["release"])] == ["reserve"]

    with pytest.raises(InvalidOperation, match="step 'reserve' before it is compensated, not completed; rerun from "
                                               "'reserve' or earlier"):
        env.app.rerun(old.id, "charge", by="ops")
    assert env.get_run(old).run.rerun_as is None

    FIXED["charge"] = True
    new = env.finish(env.app.rerun(old.id, "reserve", by="ops").id)
    assert new.state is RunState.PROCESSED
    assert [s.state for s in new.steps] == [StepState.COMPLETED] * 3
    assert new.step("reserve").idempotency_key != old.step("reserve").idempotency_key  # reserved anew


def test_a_rerun_runs_the_definition_deployed_now(shop):
    env, _ = shop
    old = env.run("plain", {"amount": 7}, business_key="o-2")
    FIXED["charge"] = True
    env.app.workflows["plain"] = Workflow("plain", [  # a new version: a step added after the charge
        Step("note", "shop.work", timeout=5), Step("charge", "shop.charge", timeout=5),
        Step("receipt", "shop.work", timeout=5), Step("ship", "shop.work", timeout=5)])

    new = env.finish(env.app.rerun(old.id, "charge", by="ops").id)

    assert [s.name for s in new.steps] == ["note", "charge", "receipt", "ship"]
    assert new.run.version != old.run.version and new.state is RunState.PROCESSED
    with pytest.raises(InvalidOperation, match="as deployed now has no such step; its steps: note, charge, receipt"):
        env.app.rerun(new.id, "pay", by="ops")


def test_a_rerun_is_refused_with_its_reason_and_writes_nothing(shop):
    env, a = shop
    old = env.run("plain", {"amount": 1}, business_key="o-3")
    env.stub(a["work"], hangs=True)
    live = env.start("plain", {"amount": 2}, business_key="o-4")  # its first step hangs: still processing
    env.unstub(a["work"])
    before = len(env.app.store.list_runs())

    cases = [
        (live.id, "charge", f"cannot rerun run {live.id}: it is still processing; let it end, or cancel it first"),
        (old.id, "pay", "workflow 'plain' as deployed now has no such step; its steps: note, charge, ship"),
    ]
    for run_id, step, reason in cases:
        with pytest.raises(InvalidOperation) as refused:
            env.app.rerun(run_id, step, by="ops")
        assert reason in str(refused.value)
    with pytest.raises(UnknownRun):
        env.app.rerun("nope", "charge", by="ops")
    assert len(env.app.store.list_runs()) == before

    first = env.app.rerun(old.id, "charge", by="ops")  # once: a second (a bulk rerun sent twice) is refused
    with pytest.raises(InvalidOperation, match=f"it was rerun already, as run {first.id}"):
        env.app.rerun(old.id, "charge", by="ops")
    assert len(env.app.store.list_runs()) == before + 1


#: the app `sas rerun` loads here (``--app tests.unit.test_reruns:CLI_APP``)
CLI_APP: SasApp | None = None


def test_sas_rerun_prints_the_new_run_and_refuses_with_the_reason(shop):
    global CLI_APP
    env, _ = shop
    CLI_APP = env.app
    old = env.run("plain", {"amount": 3}, business_key="o-5")
    runner = CliRunner()

    bad = runner.invoke(main, ["--app", "tests.unit.test_reruns:CLI_APP", "rerun", old.id, "--from", "pay"])
    assert bad.exit_code == 2 and "has no such step; its steps: note, charge, ship" in bad.output
    done = runner.invoke(main, ["--app", "tests.unit.test_reruns:CLI_APP", "rerun", old.id, "--from", "charge",
                                "--by", "ann", "--reason", "fixed"])
    assert done.exit_code == 0, done.output
    new_id = env.get_run(old).run.rerun_as
    assert f"run {old.id} rerun as run {new_id}" in done.output
    shown = runner.invoke(main, ["--app", "tests.unit.test_reruns:CLI_APP", "show", old.id], env={"COLUMNS": "200"})
    assert f"rerun as run {new_id}" in shown.output


def test_a_run_is_rerun_from_its_dashboard_page_and_each_page_links_the_other(shop):
    env, _ = shop
    old = env.run("plain", {"amount": 4}, business_key="o-6")
    FIXED["charge"] = True
    web = create_dashboard(env.app, basic_auth=parse_basic_auth("ops:s3cret"), metrics_margin=0.0).test_client()
    page = web.get(f"/runs/{old.id}", headers=OPS).get_data(as_text=True)
    assert re.search(r'data-action="rerun".*<option>note</option><option>charge</option><option>ship</option>',
                     page, re.S)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)

    refused = web.post(f"/runs/{old.id}/act", headers=OPS,
                       data={"action": "rerun", "step": "pay", "csrf_token": token, "reason": "r"})
    assert refused.status_code == 409 and "has no such step" in refused.get_data(as_text=True)
    sent = web.post(f"/runs/{old.id}/act", headers=OPS,
                    data={"action": "rerun", "step": "charge", "csrf_token": token, "reason": "fixed"})
    assert sent.status_code == 303
    new_id = env.get_run(old).run.rerun_as
    assert f"run {old.id} rerun as run {new_id}" in web.get(sent.location, headers=OPS).get_data(as_text=True)
    assert env.finish(new_id).state is RunState.PROCESSED
    assert f'<p id="rerun-as">rerun as <a href="/runs/{new_id}">' in web.get(f"/runs/{old.id}",
                                                                           headers=OPS).get_data(as_text=True)
    assert f'<p id="rerun-of">rerun of <a href="/runs/{old.id}">{old.id}</a>, from step charge' in \
        web.get(f"/runs/{new_id}", headers=OPS).get_data(as_text=True)


def test_a_carried_step_is_undone_under_the_old_run_s_key_when_the_rerun_fails(shop):
    env, a = shop
    FIXED["charge"] = True
    old = env.run("saga", {"amount": 9}, business_key="s-2")
    assert old.state is RunState.PROCESSED
    FIXED["charge"] = False  # broken again: the rerun from the charge fails and is undone

    new = env.finish(env.app.rerun(old.id, "charge", by="ops").id)

    assert new.state is RunState.COMPENSATED
    [undo] = env.calls(a["release"])
    assert (undo.run_id, undo.undoes.step) == (new.id, "reserve")
    assert undo.idempotency_key == old.step("reserve").idempotency_key + ":undo"  # the effect the old run applied
    assert [c.run_id for c in env.calls(a["work"]) if c.step == "reserve"] == [old.id]  # reserved once


def test_a_rerun_from_a_later_step_carries_every_step_before_it_and_the_old_run_takes_no_other_action(shop):
    env, _ = shop
    FIXED["charge"] = True
    old = env.run("plain", {"amount": 2}, business_key="o-7")

    new = env.finish(env.app.rerun(old.id, "ship", by="ops").id)

    assert new.state is RunState.PROCESSED
    assert [(s.name, s.result) for s in new.steps[:2]] == [(s.name, s.result) for s in old.steps[:2]]
    assert sorted(c.step for c in env.calls() if c.run_id == new.id) == ["ship"]
    for act in (lambda: env.app.resubmit(old.id, by="ops"), lambda: env.app.compensate(old.id, by="ops"),
                lambda: env.app.mark_done(old.id, "ship", by="ops")):
        with pytest.raises(InvalidOperation, match=f"it was rerun as run {new.id}; act on that one"):
            act()
