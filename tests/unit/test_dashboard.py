"""The dashboard and the metrics, read from a store filled by real runs (the in-process pump on
SQLite): each page shows what happened, filters filter, and the metrics count it."""

from __future__ import annotations

import base64
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from sas_app import WaitFor, Workflow
from sas_app.store.tables import runs
from sas_app.web.dashboard import create_dashboard
from sas_app.web.people import parse_basic_auth
from tests.support import sweep_after_expiry, wait_for


@pytest.fixture
def filled(sas, pump):
    """Three processed runs, one the Supervisor recovered, one undone after a permanent fault."""
    done = [sas.submit("three", {}, business_key=f"ok-{i}") for i in range(3)]
    pump.run()
    recovered = sas.submit("saga", {"script": {"second": ["hang", "ok"]}}, business_key="hung-1")
    sweep_after_expiry(sas, pump, recovered.id)
    undone = sas.submit("saga", {"script": {"third": ["permanent"]}}, business_key="refused-1")
    pump.run()
    sas.supervisor.sweep()  # a heartbeat
    assert [h.status().process_state for h in (*done, recovered, undone)] == \
        ["processed"] * 4 + ["compensated"]
    sas.test_clock.advance(0.01)  # the store's clock stands still: let the history be in the past
    return {"recovered": recovered.id, "undone": undone.id}


@pytest.fixture
def client(sas):
    # every event counts at once here (the real margin waits out transactions still committing)
    return create_dashboard(sas, flower_url="http://flower.example:5555", metrics_margin=0.0).test_client()


def test_the_overview_counts_runs_by_state_and_charts_them(client, filled):
    page = client.get("/").get_data(as_text=True)

    assert 'data-state="processed" style' in page and "<b>4</b>" in page
    assert page.count('class="bar" data-state="processed" data-count="4"') == 1
    assert page.count('class="bar" data-state="compensated" data-count="1"') == 1
    assert "no Supervisor has swept yet" not in page


def test_runs_filter_by_state_workflow_and_key(client, filled):
    def rows(query: str) -> list[str]:
        page = client.get(f"/runs?{query}").get_data(as_text=True)
        return [line for line in page.splitlines() if line.startswith('<tr class="run"')]

    assert len(rows("")) == 5
    picker = client.get("/runs").get_data(as_text=True).split('id="workflow"')[1].split("</select>")[0]
    assert re.findall(r'<option value="([^"]+)"', picker) == ["saga", "three"]  # the workflows that have runs
    assert rows("state=compensated") == [r for r in rows("") if 'data-state="compensated"' in r]
    assert len(rows("state=compensated")) == 1
    assert len(rows("workflow=three")) == 3 and len(rows("workflow=saga&state=processed")) == 1
    assert len(rows("key=ok-")) == 3 and rows("key=%25") == []  # a % in the key is a character, not a wildcard
    assert client.get("/runs?state=bogus").status_code == 400


def test_a_run_page_shows_the_supervisor_recovery_on_its_timeline(client, filled):
    run_id = filled["recovered"]
    page = client.get(f"/runs/{run_id}").get_data(as_text=True)

    assert 'class="attempt recovered recovery"' in page
    assert "attempt 1 passed its complete-by: Supervisor recovery" in page
    assert f"http://flower.example:5555/task/{run_id}-1-2" in page  # the retried dispatch, in Flower
    assert page.count('class="segment completed"') == 3
    history = page.split('id="events"', 1)[1]
    assert "reason: expired" in history
    assert re.search(r"complete_by: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", history)  # a time, not an epoch
    assert client.get("/runs/nope").status_code == 404


def test_a_run_page_lists_branches_under_their_step_and_links_only_real_tasks(client, sas, pump):
    handle = sas.submit("fanout", {"items": ["a", "b", "c"]}, business_key="fan-page")
    pump.run()
    sas.test_clock.advance(0.01)
    page = client.get(f"/runs/{handle.id}").get_data(as_text=True)

    lanes = re.findall(r'<tr class="lane( branch)?" data-step="([^"]+)"', page)
    assert [name for _, name in lanes] == ["prepare", "ship", "ship[0]", "ship[1]", "ship[2]", "confirm"]
    assert [name for branch, name in lanes if branch] == ["ship[0]", "ship[1]", "ship[2]"]
    assert "fanned out to 3 branches: completed" in page
    assert f"/task/{handle.id}-1-" not in page  # the fan-out itself is no Celery task
    assert page.count(f"http://flower.example:5555/task/{handle.id}-") == 2 * 5  # five tasks, bar and list each
    assert f'id="run-version">{handle.status().run.version}<' in page


def test_parent_and_child_runs_link_to_each_other(client, sas, pump):
    handle = sas.submit("parent", {}, business_key="family")
    pump.run()
    [child] = sas.store.children(handle.id)
    sas.test_clock.advance(0.01)

    parent_page = client.get(f"/runs/{handle.id}").get_data(as_text=True)
    assert f'<a href="/runs/{child.id}">kid {child.id}</a> (processed)' in parent_page
    assert f"child run {child.id}: completed" in parent_page  # the step's bar on the timeline
    assert f"/task/{handle.id}-1-" not in parent_page  # a child run is no Celery task
    child_page = client.get(f"/runs/{child.id}").get_data(as_text=True)
    assert f'child run of <a href="/runs/{handle.id}">{handle.id}</a> (its step #1), depth 1' in child_page


def test_a_sleep_is_drawn_on_the_timeline_until_it_wakes(client, sas, pump):
    handle = sas.submit("nap", {}, business_key="nap-page")
    pump.run()
    sas.test_clock.advance(0.01)
    page = client.get(f"/runs/{handle.id}").get_data(as_text=True)
    assert "asleep until " in page and f"/task/{handle.id}-1-" not in page
    sas.test_clock.move_past(handle.status().step("cool_off").not_before)
    sas.supervisor.sweep()
    pump.run()
    sas.test_clock.advance(0.01)
    page = client.get(f"/runs/{handle.id}").get_data(as_text=True)
    assert page.count('class="segment completed"') == 3  # first, the sleep, last


def test_current_alerts_are_those_whose_run_still_needs_someone(client, filled, sas, pump):
    stuck = sas.submit("three", {"script": {"second": ["permanent"]}}, business_key="stuck-1")
    pump.run()
    assert stuck.status().process_state == "error"

    page = client.get("/alerts").get_data(as_text=True)
    current, earlier = page.split('id="current"')[1].split('id="earlier"')
    assert "stuck-1" in current and "second refused" in current and "refused-1" not in current
    assert "refused-1" in earlier and "third refused" in earlier  # undone: the run has finished
    overview = client.get("/").get_data(as_text=True)
    assert "stuck-1" in overview and "refused-1" not in overview
    assert 'sas_alerts_current{kind="failed"} 1.0' in client.get("/metrics").get_data(as_text=True)


def test_the_metrics_count_what_the_history_holds(client, filled, sas, pump):
    sas.submit("three", {}, business_key="in-flight")
    pump.run(["sas.scheduler"])  # its first step sent, not yet taken
    text = client.get("/metrics").get_data(as_text=True)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    # the gauge holds the open runs (the one in flight); the finished are the counter's
    assert {labels: n for (name, labels), n in samples.items() if name == "sas_runs"} == {
        (("state", "processing"), ("workflow", "three")): 1}
    assert samples[("sas_runs_finished_total", (("state", "processed"), ("workflow", "three")))] == 3
    assert samples[("sas_runs_finished_total", (("state", "compensated"), ("workflow", "saga")))] == 1
    assert samples[("sas_step_duration_seconds_count", (("agent", "svc"),))] >= 11
    assert samples[("sas_alerts_total", (("kind", "failed"),))] == 1
    assert samples[("sas_compensations_total", (("workflow", "saga"),))] == 1
    assert samples[("sas_recoveries_total", (("agent", "svc"), ("cause", "expired")))] == 1
    assert samples[("sas_step_failures_total", (("agent", "svc"),))] == 1
    assert sum(v for (name, _), v in samples.items() if name == "sas_supervisor_sweeps_total") >= 2
    # a second scrape reads only what is new, and counts nothing twice
    again = client.get("/metrics").get_data(as_text=True)
    assert 'sas_alerts_total{kind="failed"} 1.0' in again


def test_the_metrics_carry_what_sas_doctor_finds(client, sas, pump):
    """A run left live with nothing due (its pause lifted behind sas_app's back) is counted."""
    handle = sas.submit("three", {}, business_key="left")
    pump.run(["sas.scheduler"])
    sas.pause(handle.id, by="ops")
    pump.run()
    with sas.store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == handle.id).values(paused_by=None))

    text = client.get("/metrics").get_data(as_text=True)
    samples = {(s.name, tuple(s.labels.items())): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("sas_doctor_problems", (("check", "stranded_runs"),))] == 1
    assert samples[("sas_doctor_problems", (("check", "attempts_ended_twice"),))] == 0
    assert samples[("sas_doctor_ok", ())] == 0


def test_basic_auth_as_flower_takes_it(sas):
    app = create_dashboard(sas, basic_auth=parse_basic_auth("ops:s3cret,viewer:also")).test_client()
    good = base64.b64encode(b"viewer:also").decode()
    bad = base64.b64encode(b"ops:wrong").decode()

    assert app.get("/").status_code == 401
    assert app.get("/metrics", headers={"Authorization": f"Basic {bad}"}).status_code == 401
    assert app.get("/runs", headers={"Authorization": f"Basic {good}"}).status_code == 200
    assert app.get("/healthz").status_code == 200
    with pytest.raises(ValueError, match="user:password"):
        parse_basic_auth("just-a-user")


def samples_of(registry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import generate_latest

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode()) for s in family.samples}


def test_counters_appear_only_once_they_hold_the_whole_history(sas, filled):
    from prometheus_client import CollectorRegistry

    from sas_app.web.metrics import StoreCollector

    registry = CollectorRegistry()
    registry.register(StoreCollector(sas, margin=0.0, batch=3, max_batches=2))  # 6 events a scrape
    first = samples_of(registry)
    assert first[("sas_metrics_caught_up", ())] == 0
    history_counters = ("sas_runs_finished", "sas_step_", "sas_recoveries", "sas_compensations", "sas_alerts",
                        "sas_stale_replies")
    assert not [name for name, _ in first if name.startswith(history_counters)]
    assert first[("sas_runs_waiting", (("kind", "sleep"),))] == 0  # gauges are read at once

    for _ in range(100):
        samples = samples_of(registry)
        if samples[("sas_metrics_caught_up", ())] == 1:
            break
    assert samples[("sas_runs_finished_total", (("state", "processed"), ("workflow", "three")))] == 3
    assert samples[("sas_recoveries_total", (("agent", "svc"), ("cause", "expired")))] == 1
    assert samples[("sas_alerts_total", (("kind", "failed"),))] == 1


def test_an_event_still_too_young_holds_back_the_ones_after_it(sas):
    """Two transactions inserting at once can give a later id an earlier time: counting stops at
    the young event instead of skipping it, or it would never be counted."""
    from prometheus_client import CollectorRegistry
    from sqlalchemy import insert, update

    from sas_app.store.tables import events
    from sas_app.web.metrics import StoreCollector

    now = sas.store.now()
    with sas.store.engine.begin() as conn:
        young = conn.execute(insert(events).values(run_id="r1", kind="alert", at=now, detail={"kind": "failed"})
                             ).inserted_primary_key[0]
        conn.execute(insert(events).values(run_id="r2", kind="alert", at=now - 60, detail={"kind": "failed"}))
    registry = CollectorRegistry()
    registry.register(StoreCollector(sas, margin=5.0))

    assert samples_of(registry).get(("sas_alerts_total", (("kind", "failed"),)), 0) == 0
    with sas.store.engine.begin() as conn:  # time passes: the young one is old enough now
        conn.execute(update(events).where(events.c.id == young).values(at=now - 30))
    assert samples_of(registry)[("sas_alerts_total", (("kind", "failed"),))] == 2


def test_each_supervisor_process_counts_its_sweeps_and_recoveries(sas, pump):
    from sas_app.store.observe import Observer
    from tests.support import sweep_after_expiry

    handle = sas.submit("saga", {"script": {"second": ["hang", "ok"]}}, business_key="hung-2")
    sweep_after_expiry(sas, pump, handle.id)
    sas.supervisor.sweep()

    [me] = Observer(sas.store).supervisors(sas.settings.supervisor_interval)
    assert me.instance == sas.supervisor.instance_id
    assert me.sweeps >= 2 and me.recovered == 1


def test_a_waiting_run_is_approved_from_its_page_behind_auth_and_csrf(sas, pump):
    waiting = sas.submit("claim", {"amount": 80}, business_key="claim-1")
    sas.submit("nap", {}, business_key="nap-1")
    pump.run()
    ops = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}
    app = create_dashboard(sas, basic_auth=parse_basic_auth("ops:s3cret"), metrics_margin=0.0).test_client()

    overview = app.get("/", headers=ops).get_data(as_text=True)
    rows = re.findall(r'<tr class="waiting" data-kind="(\w+)">.*?>(\w+) ([\w-]+)</a></td><td>(\w+)</td>', overview)
    assert sorted(rows) == [("event", "claim", "claim-1", "manager"), ("sleep", "nap", "nap-1", "cool_off")]
    metrics = app.get("/metrics", headers=ops).get_data(as_text=True)
    assert 'sas_runs_waiting{kind="event"} 1.0' in metrics and 'sas_runs_waiting{kind="sleep"} 1.0' in metrics

    page = app.get(f"/runs/{waiting.id}", headers=ops).get_data(as_text=True)
    assert "Approve" in page and "Reject" in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    form = {"event": "approval", "decision": "approve"}
    assert app.post(f"/runs/{waiting.id}/signal", data=form).status_code == 401  # no credentials
    assert app.post(f"/runs/{waiting.id}/signal", data=form, headers=ops).status_code == 400  # no token
    assert sas.store.signals_of(waiting.id) == []
    sent = app.post(f"/runs/{waiting.id}/signal", data={**form, "csrf_token": token}, headers=ops)
    assert sent.status_code == 303
    assert sent.location == f"/runs/{waiting.id}"  # the notice is not in the URL, where a link could fake it
    assert "signal approved: consumed" in app.get(sent.location, headers=ops).get_data(as_text=True)
    forged = app.get(f"/runs/{waiting.id}?sent=approved: consumed", headers=ops).get_data(as_text=True)
    assert "approved: consumed" not in forged
    pump.run()
    view = waiting.status()
    assert (view.process_state, view.step("manager").result) == ("processed", {"approved": True, "by": "ops"})
    assert [(s.status, s.sent_by) for s in sas.store.signals_of(waiting.id)] == [("consumed", "ops")]
    late = app.post(f"/runs/{waiting.id}/signal", data={**form, "csrf_token": token}, headers=ops)
    assert late.status_code == 409 and "it takes no more signals" in late.get_data(as_text=True)


def test_without_credentials_the_dashboard_only_reads(sas, pump):
    waiting = sas.submit("claim", {}, business_key="claim-2")
    pump.run()
    app = create_dashboard(sas, metrics_margin=0.0).test_client()
    page = app.get(f"/runs/{waiting.id}").get_data(as_text=True)
    assert "Approve" not in page and f"sas signal {waiting.id} approval" in page
    refused = app.post(f"/runs/{waiting.id}/signal", data={"event": "approval", "decision": "approve"})
    assert refused.status_code == 403 and "needs its basic auth" in refused.get_data(as_text=True)
    assert sas.store.signals_of(waiting.id) == []


def test_runs_holding_and_waiting_for_a_slot_of_their_key(sas, pump, client):
    sas.register(Workflow("one_per_desk", [WaitFor("done", "done", timeout=3600)], concurrency_key="desk"))
    holder = sas.submit("one_per_desk", {"desk": "d1"}, business_key="h")
    sas.test_clock.advance(0.5)
    waiter = sas.submit("one_per_desk", {"desk": "d1"}, business_key="w")
    pump.run()
    sas.test_clock.advance(2.0)
    assert "holds a slot for 2.0 s" in client.get(f"/runs/{holder.id}").get_data(as_text=True)
    assert "waits for a slot for 2.0 s" in client.get(f"/runs/{waiter.id}").get_data(as_text=True)
    overview = client.get("/").get_data(as_text=True)
    assert re.search(r'<tr class="waiting" data-kind="slot"><td><a href="/runs/\w+">one_per_desk w</a>', overview)
    assert 'sas_runs_waiting{kind="slot"} 1.0' in client.get("/metrics").get_data(as_text=True)


def test_every_metric_label_holds_one_of_its_known_values(env, sas, pump, filled, client):
    """A label is a code, never a message: free text would grow Prometheus's series without limit.
    A deferral (its breaker's message was once its label), a lost worker, a wait, an alert of each
    kind — each label value must come from its known set."""
    from sas_app.engine import alerts
    from sas_app.interfaces.doctor import CHECKS
    from sas_app.states import RUN_STATES, Cause
    from sas_app.store.backlog import BACKLOG_STATES

    deferred = sas.submit("three", {"script": {"first": ["deferred", "ok"]}}, business_key="deferred-1")
    env.finish(deferred.id)
    sas.submit("claim", {}, business_key="waits-1")
    pump.run()
    sas.test_clock.advance(0.01)

    known = {
        "workflow": set(sas.workflows), "agent": set(sas.agents), "state": set(RUN_STATES) | set(BACKLOG_STATES),
        "cause": {c.value for c in Cause} | {"other"},
        "kind": {alerts.FAILED, alerts.COMPENSATION_FAILED, alerts.COMPENSATION_STUCK, alerts.AT_RISK,
                 alerts.DEADLINE, alerts.ESCALATED, "sleep", "event", "slot"},
        "check": set(CHECKS),
        "instance": {sas.supervisor.instance_id},  # the live Supervisors' (gone ones are dropped)
        "le": None,  # a histogram's buckets: numbers
    }
    text = client.get("/metrics").get_data(as_text=True)
    seen: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for label, value in sample.labels.items():
                assert label in known, f"{sample.name} has a label {label!r} with no known set"
                seen.setdefault(label, set()).add(value)
                if label == "le":
                    float(value)
                else:
                    assert value in known[label], f"{sample.name}{{{label}={value!r}}}: not one of {known[label]}"
    assert "deferred" in seen["cause"] and "expired" in seen["cause"]


def test_a_supervisor_not_heard_from_is_marked_gone_then_dropped(sas, pump, client):
    from sqlalchemy import insert, select

    from sas_app.store.service_tables import supervisors

    sas.supervisor.sweep()  # this process: sweeping
    now = sas.store.now()
    with sas.store.engine.begin() as conn:
        conn.execute(insert(supervisors), [
            {"instance": "old-host:11", "sweeps": 40, "recovered": 0, "last_sweep_at": now - 120},  # stopped
            {"instance": "older-host:12", "sweeps": 9, "recovered": 0, "last_sweep_at": now - 7200},  # long ago
        ])

    page = client.get("/").get_data(as_text=True)
    table = page.split('id="supervisors"')[1].split("</table>")[0]
    assert f'data-gone="false"><td>{sas.supervisor.instance_id}</td>' in table
    assert 'data-gone="true"><td>old-host:11</td>' in table and "gone (stopped?)" in table
    assert "older-host:12" not in table, "an hour unheard: left out"

    sas.supervisor.sweep()  # and its row deleted
    with sas.store.engine.connect() as conn:
        assert set(conn.execute(select(supervisors.c.instance)).scalars()) == {sas.supervisor.instance_id,
                                                                               "old-host:11"}


def test_the_overview_says_how_many_alerts_need_nobody_any_more(client, filled):
    page = client.get("/").get_data(as_text=True)
    section = page.split("Alerts needing someone")[1]
    assert "no alerts" in section  # the one failure's run was undone: nobody's turn
    assert "1 earlier alert belongs to runs that have since finished" in section


def test_a_run_page_shows_each_attempt_s_transient_faults(client, env, sas):

    handle = sas.submit("three", {"script": {"second": ["transient", "transient", "ok"]}}, business_key="flaky-1")
    env.finish(handle.id)

    page = client.get(f"/runs/{handle.id}").get_data(as_text=True)
    row = next(r for r in page.split("<tr") if 'data-kind="faults"' in r)
    assert "2 transient faults: second busy; then: second busy" in row


def test_a_scrape_never_waits_for_sas_doctors_examination(sas, pump):
    """Only the first scrape waits for an examination; later ones answer with the last one's
    findings while the next is made in the background (it asks the workers for up to a second)."""
    from prometheus_client import CollectorRegistry

    from sas_app.web.metrics import StoreCollector

    handle = sas.submit("three", {}, business_key="left")
    pump.run(["sas.scheduler"])
    sas.pause(handle.id, by="ops")
    pump.run()
    with sas.store.engine.begin() as conn:  # its pause lifted behind sas_app's back: stranded
        conn.execute(update(runs).where(runs.c.id == handle.id).values(paused_by=None))
    collector = StoreCollector(sas, margin=0.0, doctor_every=0.0)
    registry = CollectorRegistry()
    registry.register(collector)
    stranded = ("sas_doctor_problems", (("check", "stranded_runs"),))
    assert samples_of(registry)[stranded] == 1

    with sas.store.engine.begin() as conn:  # paused again: nothing stranded any more
        conn.execute(update(runs).where(runs.c.id == handle.id).values(paused_by="ops"))
    samples = samples_of(registry)  # answered at once, with what the last examination found
    assert samples[stranded] == 1 and collector.examining is not None and collector.examining.is_alive()
    wait_for(lambda: samples_of(registry)[stranded] == 0, 15, "a later examination to find it gone")


def scraped_by_a_new_dashboard(sas, **options) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A dashboard started now, scraped once (every event counts at once, its checkpoint saved at each)."""
    from prometheus_client import CollectorRegistry

    from sas_app.web.metrics import StoreCollector

    registry = CollectorRegistry()
    registry.register(StoreCollector(sas, margin=0.0, checkpoint_every=0.0, **options))
    return samples_of(registry)


FINISHED = ("sas_runs_finished_total", (("state", "processed"), ("workflow", "three")))


@pytest.mark.both_stores
def test_a_dashboard_started_later_resumes_from_the_counters_checkpoint(sas, pump, filled):
    """A dashboard restarted over a long history resumes from the furthest checkpoint any replica
    saved: its counters appear at once, and keep what a purge has deleted since."""
    from sqlalchemy import delete, func, select, update

    from sas_app.store.service_tables import checkpoints
    from sas_app.store.tables import events
    from sas_app.web.metrics import CHECKPOINT

    before = scraped_by_a_new_dashboard(sas)
    assert before[("sas_metrics_caught_up", ())] == 1 and before[FINISHED] == 3
    with sas.store.engine.connect() as conn:
        newest = conn.execute(select(func.max(events.c.id))).scalar()
    assert sas.store.checkpoint(CHECKPOINT)[0] == newest

    sas.submit("three", {}, business_key="ok-after")  # more history, then the old one purged
    pump.run()
    sas.test_clock.advance(0.01)
    with sas.store.engine.begin() as conn:
        conn.execute(delete(events).where(events.c.id <= newest))

    resumed = scraped_by_a_new_dashboard(sas)
    assert resumed[("sas_metrics_caught_up", ())] == 1 and resumed[FINISHED] == 4
    assert resumed[("sas_recoveries_total", (("agent", "svc"), ("cause", "expired")))] == 1
    assert resumed[("sas_alerts_total", (("kind", "failed"),))] == 1
    durations = ("sas_step_duration_seconds_count", (("agent", "svc"),))
    assert resumed[durations] == before[durations] + 3
    assert resumed[("sas_step_duration_seconds_bucket", (("agent", "svc"), ("le", "0.05")))] == before[durations] + 3

    # a replica behind the checkpoint never moves it back
    furthest = sas.store.checkpoint(CHECKPOINT)
    sas.store.save_checkpoint(CHECKPOINT, newest, {})
    assert sas.store.checkpoint(CHECKPOINT) == furthest
    # one that cannot be read is left: the history is read again (what the purge left: one run)
    with sas.store.engine.begin() as conn:
        conn.execute(update(checkpoints).values(state={"finished": "garbled"}))
    assert scraped_by_a_new_dashboard(sas)[FINISHED] == 1


@pytest.mark.both_stores
def test_after_a_purge_of_the_newest_events_the_next_ones_are_counted(sas, pump):
    """Once a purge has deleted every run, the next events are counted by a dashboard that had read
    up to the purged ones, running or restarted. SQLite used to give a new row the table's largest
    id plus one: the next events took the purged ones' ids, and the dashboard never read them."""
    from prometheus_client import CollectorRegistry

    from sas_app.states import TERMINAL_RUN_STATES
    from sas_app.web.metrics import StoreCollector

    for key in ("a", "b"):
        sas.submit("three", {}, business_key=key)
    pump.run()
    sas.test_clock.advance(0.01)
    running = CollectorRegistry()
    running.register(StoreCollector(sas, margin=0.0, checkpoint_every=0.0))
    assert samples_of(running)[FINISHED] == 2  # read up to the newest event, and saved there
    assert sas.store.purge_batch(0.0, sorted(TERMINAL_RUN_STATES), 100)[0] == 2  # every run, every event
    sas.submit("three", {}, business_key="c")
    pump.run()
    sas.test_clock.advance(0.01)

    assert samples_of(running)[FINISHED] == 3
    assert scraped_by_a_new_dashboard(sas)[FINISHED] == 3  # resumed from the checkpoint
