"""Operators acting from the dashboard (the in-process pump on SQLite): each action behind basic
auth and a CSRF token, recorded with the authenticated user, refused with the CLI's message and
nothing changed; bulk actions touch exactly the runs their confirmation page counted."""

from __future__ import annotations

import base64
import html
import re

import pytest

from sas_app.web.dashboard import create_dashboard
from sas_app.web.people import parse_basic_auth, parse_roles

OPS = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}


@pytest.fixture
def web(sas):
    return create_dashboard(sas, basic_auth=parse_basic_auth("ops:s3cret"), metrics_margin=0.0).test_client()


def token(web, path):
    """The session's CSRF token, from a page with a form."""
    return re.search(r'name="csrf_token" value="([^"]+)"', web.get(path, headers=OPS).get_data(as_text=True)).group(1)


def act(web, run_id, action, page=None, **form):
    return web.post(f"/runs/{run_id}/act", headers=OPS,
                    data={"action": action, "csrf_token": token(web, page or f"/runs/{run_id}"), **form})


def operator_events(sas, run_id):
    return [(e.detail["action"], e.actor, e.detail["reason"]) for e in sas.store.get_events(run_id)
            if e.kind == "operator"]


def failed(sas, pump, key, workflow="three", step="second"):
    handle = sas.submit(workflow, {"script": {step: ["permanent", "ok"]}}, business_key=key)
    pump.run()
    assert handle.status().process_state == "error"
    return handle


def test_a_failed_run_is_resubmitted_from_its_page_and_the_history_names_the_user(sas, pump, web):
    handle = failed(sas, pump, "r1")
    shown = web.get(f"/runs/{handle.id}", headers=OPS)
    page = shown.get_data(as_text=True)
    assert re.search(r'data-action="resubmit".*<option>second</option>', page, re.S)
    assert (shown.headers["X-Frame-Options"], shown.headers["Content-Security-Policy"]) == \
        ("DENY", "frame-ancestors 'none'"), "no other site frames the buttons"

    sent = act(web, handle.id, "resubmit", step="second", input='{"fixed": true}', reason="card re-enabled")
    assert sent.status_code == 303
    assert f"run {handle.id} resubmitted" in web.get(sent.location, headers=OPS).get_data(as_text=True)
    pump.run()
    view = handle.status()
    assert (view.process_state, view.step("second").input) == ("processed", {"fixed": True})
    assert operator_events(sas, handle.id) == [("resubmit", "ops", "card re-enabled")]


def test_mark_done_pause_resume_cancel_and_compensate_from_the_page(sas, pump, web):
    by_hand = failed(sas, pump, "m1")
    assert act(web, by_hand.id, "mark_done", step="second", result='{"manual": 1}').status_code == 303
    pump.run()
    assert (by_hand.status().process_state, by_hand.status().step("second").result) == ("processed", {"manual": 1})

    held = sas.submit("saga", {}, business_key="p1")
    pump.run(["sas.scheduler"])
    assert act(web, held.id, "pause", reason="hold").status_code == 303
    pump.run()
    assert held.status().run.paused_by == "ops"
    paused = web.get(f"/runs/{held.id}", headers=OPS).get_data(as_text=True)
    assert 'data-action="resume"' in paused and 'data-action="pause"' not in paused
    assert act(web, held.id, "compensate", reason="order void").status_code == 303
    pump.run()
    assert held.status().process_state == "compensated"

    waiting = sas.submit("claim", {}, business_key="c1")
    pump.run()
    sent = act(web, waiting.id, "cancel", reason="customer asked")
    assert f"run {waiting.id} compensating" in web.get(sent.location, headers=OPS).get_data(as_text=True)
    pump.run()
    assert waiting.status().process_state == "cancelled"
    assert operator_events(sas, held.id) == [("pause", "ops", "hold"), ("compensate", "ops", "order void")]
    assert operator_events(sas, waiting.id) == [("cancel", "ops", "customer asked")]


def test_an_action_the_state_does_not_allow_is_refused_with_the_clis_message(sas, pump, web):
    done = sas.submit("three", {}, business_key="d1")
    page = f"/runs/{failed(sas, pump, 'd2').id}"  # a page with a form, for the session's token
    before = done.status()
    for action, message in [("resume", f"cannot resume run {done.id}: it is processed and not paused"),
                            ("cancel", f"cannot cancel run {done.id}: it is processed"),
                            ("resubmit", f"cannot resubmit run {done.id}: it is processed, not error")]:
        refused = act(web, done.id, action, page)
        assert refused.status_code == 409
        assert re.search(r'<p id="refused" class="refused">(.*?)</p>', refused.get_data(as_text=True)).group(1) \
            == message
    assert done.status() == before


def test_bad_input_is_a_clear_error_and_writes_nothing(sas, pump, web):
    handle = failed(sas, pump, "b1")
    before = handle.status()
    bad_json = act(web, handle.id, "resubmit", input="{not json")
    assert bad_json.status_code == 400 and "input is not valid JSON" in bad_json.get_data(as_text=True)
    assert act(web, handle.id, "mark_done").status_code == 400  # which step?
    assert act(web, handle.id, "delete").status_code == 400
    assert act(web, "nope", "pause", f"/runs/{handle.id}").status_code == 404
    assert handle.status() == before


def test_no_action_without_credentials_and_a_token(sas, pump, web):
    handle = failed(sas, pump, "a1")
    form = {"action": "resubmit"}
    assert web.post(f"/runs/{handle.id}/act", data=form).status_code == 401
    assert web.post(f"/runs/{handle.id}/act", data=form, headers=OPS).status_code == 400  # no CSRF token
    reader = create_dashboard(sas, metrics_margin=0.0).test_client()
    assert reader.post(f"/runs/{handle.id}/act", data=form).status_code == 403
    page = reader.get(f"/runs/{handle.id}").get_data(as_text=True)
    hint = f"sas resubmit | mark-done | pause | resume | cancel | compensate | rerun {handle.id}"
    assert 'class="act"' not in page and hint in page
    assert handle.status().process_state == "error" and operator_events(sas, handle.id) == []


def test_bulk_resubmit_of_the_runs_a_filter_selects_after_a_confirmation(sas, pump, web):
    payment = [failed(sas, pump, f"pay-{i}", step="second") for i in range(3)]
    other = failed(sas, pump, "ship-1", step="third")  # in error, but its failure names another step
    fine = sas.submit("three", {}, business_key="fine")
    pump.run()

    listing = web.get("/runs?state=error&failure=SECOND+refused", headers=OPS).get_data(as_text=True)
    assert len(re.findall(r'<tr class="run"', listing)) == 3 and 'id="bulk-resubmit"' in listing
    page = web.get("/runs/bulk?action=resubmit&state=error&workflow=three&failure=second+refused", headers=OPS)
    text = html.unescape(page.get_data(as_text=True))
    assert re.search(r'<b id="count">(\d+)</b>', text).group(1) == "3"
    assert "runs in error of three whose error says 'second refused'" in text
    ids = re.findall(r'name="run" value="(\w+)"', text)
    assert sorted(ids) == sorted(h.id for h in payment)
    assert all(h.status().process_state == "error" for h in payment)  # a confirmation page changes nothing

    sas.resubmit(payment[0].id, by="someone-else")  # between the confirmation and the click
    form = {"action": "resubmit", "run": ids, "reason": "payment service back",
            "csrf_token": token(web, f"/runs/{other.id}"), "filter": "state=error"}
    done = web.post("/runs/bulk", data=form, headers=OPS).get_data(as_text=True)
    assert "Resubmit: 2 done, 1 refused" in done
    assert f"{payment[0].id}</a>: cannot resubmit run {payment[0].id}: it is processing, not error" in done
    pump.run()
    assert [h.status().process_state for h in (*payment, other, fine)] == ["processed"] * 3 + ["error", "processed"]
    assert [operator_events(sas, h.id) for h in payment[1:]] == [[("resubmit", "ops", "payment service back")]] * 2


def test_bulk_cancel_counts_only_the_runs_it_may_cancel(sas, pump, web):
    waiting = [sas.submit("claim", {}, business_key=f"w-{i}") for i in range(2)]
    done = sas.submit("claim", {"script": {"file": ["permanent"]}}, business_key="gone")  # ends in error
    pump.run()
    text = web.get("/runs/bulk?action=cancel&workflow=claim", headers=OPS).get_data(as_text=True)
    assert re.search(r'<b id="count">(\d+)</b>', text).group(1) == "2" and "the other 1 is left alone" in text
    ids = re.findall(r'name="run" value="(\w+)"', text)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', text).group(1)
    result = web.post("/runs/bulk", headers=OPS,
                      data={"action": "cancel", "run": ids, "csrf_token": csrf}).get_data(as_text=True)
    assert "Cancel: 2 done, 0 refused" in result
    pump.run()
    assert [h.status().process_state for h in (*waiting, done)] == ["cancelled", "cancelled", "error"]
    assert web.get("/runs/bulk?action=delete", headers=OPS).status_code == 400
    assert web.post("/runs/bulk", headers=OPS, data={"action": "cancel", "csrf_token": csrf}).status_code == 400


def basic(user):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:pw-{user}".encode()).decode()}


@pytest.fixture
def by_role(sas):
    """A dashboard with a viewer, an approver and an operator (``--roles``)."""
    return create_dashboard(sas, basic_auth=parse_basic_auth("vic:pw-vic,amy:pw-amy,oli:pw-oli"),
                            roles=parse_roles("amy=approver,oli=operator"), metrics_margin=0.0).test_client()


def form_token(web, path, headers):
    return re.search(r'name="csrf_token" value="([^"]+)"', web.get(path, headers=headers).get_data(as_text=True)
                     ).group(1)


def test_each_role_sees_and_may_do_only_what_it_is_allowed_and_refusals_are_audited(sas, pump, by_role):
    handle = sas.submit("claim", {}, business_key="claim-r")
    pump.run()
    viewer_page = by_role.get(f"/runs/{handle.id}", headers=basic("vic")).get_data(as_text=True)
    assert "<form" not in viewer_page and "vic is viewer: approving needs the approver role" in viewer_page
    assert "vic is viewer: acting on runs needs the operator role" in viewer_page
    approver_page = by_role.get(f"/runs/{handle.id}", headers=basic("amy")).get_data(as_text=True)
    assert 'value="approve"' in approver_page and 'data-action="cancel"' not in approver_page

    refused = by_role.post(f"/runs/{handle.id}/act", headers=basic("amy"),
                           data={"action": "cancel", "csrf_token": form_token(by_role, f"/runs/{handle.id}",
                                                                              basic("amy"))})
    assert refused.status_code == 403 and "amy is approver" in refused.get_data(as_text=True)
    assert by_role.get("/audit", headers=basic("amy")).status_code == 403
    assert by_role.get("/runs/bulk?action=cancel", headers=basic("vic")).status_code == 403
    approved = by_role.post(f"/runs/{handle.id}/signal", headers=basic("amy"),
                            data={"decision": "approve", "event": "approval",
                                  "csrf_token": form_token(by_role, f"/runs/{handle.id}", basic("amy"))})
    assert approved.status_code == 303
    pump.run()
    assert handle.status().process_state == "processed" and handle.status().run.cancelled_by is None
    trail = [(r.actor, r.role, r.via, r.action, r.outcome) for r in reversed(sas.store.audit_rows())]
    assert trail == [("amy", "approver", "dashboard", "cancel", "refused"),
                     ("amy", "approver", "dashboard", "signal", "done")]
    page = by_role.get("/audit", headers=basic("oli")).get_data(as_text=True)
    assert page.count('data-outcome="refused"') == 1 and "amy (approver)" in page


def test_behind_a_proxy_the_user_comes_from_its_header_and_only_from_the_proxy(sas):
    web = create_dashboard(sas, user_header="X-Forwarded-User", roles=parse_roles("oli=operator")).test_client()
    assert web.get("/runs").status_code == 401
    assert "oli (operator)" in web.get("/runs", headers={"X-Forwarded-User": "oli"}).get_data(as_text=True)
    assert "eve (viewer)" in web.get("/runs", headers={"X-Forwarded-User": "eve"}).get_data(as_text=True)
    elsewhere = web.get("/runs", headers={"X-Forwarded-User": "oli"}, environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert elsewhere.status_code == 403 and "do not come through the dashboard's proxy" in elsewhere.get_data(
        as_text=True)
    no_roles = create_dashboard(sas, user_header="X-Forwarded-User").test_client()
    assert "eve (viewer)" in no_roles.get("/runs", headers={"X-Forwarded-User": "eve"}).get_data(as_text=True)


def test_a_user_or_password_outside_ascii_logs_in(sas):
    web = create_dashboard(sas, basic_auth=[("zoë", "pässwörd")]).test_client()
    sent = {"Authorization": "Basic " + base64.b64encode("zoë:pässwörd".encode()).decode()}
    assert web.get("/runs", headers=sent).status_code == 200
    wrong = {"Authorization": "Basic " + base64.b64encode("zoë:wrong".encode()).decode()}
    assert web.get("/runs", headers=wrong).status_code == 401
    with pytest.raises(ValueError, match="with a role of viewer, approver, operator, admin"):
        parse_roles("oli=root")
