"""The HTTP API on the test kit (SQLite; ``both_stores`` ones on PostgreSQL too): what a service or
a curl does with it, each request behind a token whose role is enforced, every action in the audit
trail, and every hostile request refused with a problem that names it, nothing changed."""

from __future__ import annotations

import json

import pytest

from sas_app.web.site import create_site

pytestmark = []


@pytest.fixture
def api(sas):
    from werkzeug.test import Client

    return Client(create_site(sas, threads=4))


@pytest.fixture
def tokens(sas):
    """One token per role, by role."""
    return {role: sas.tokens.create(f"{role}-svc", role, by="test")[1]
            for role in ("viewer", "approver", "operator", "admin")}


def call(api, method, path, token=None, body=None, raw=None, headers=None, **query):
    sent = dict(headers or {})
    if token:
        sent["Authorization"] = f"Bearer {token}"
    if body is not None:
        raw, sent["Content-Type"] = json.dumps(body), "application/json"
    response = api.open(path, method=method, headers=sent, data=raw, query_string=query or None)
    return response.status_code, response.get_json(silent=True), response


def problem(api, method, path, token=None, body=None, **kw):
    """A refused request: its status and its problem's detail (checked to be problem+json)."""
    status, doc, response = call(api, method, path, token, body, **kw)
    assert response.mimetype == "application/problem+json", response.get_data(as_text=True)
    assert doc["status"] == status and doc["title"]
    return status, doc["detail"]


def audit(sas):
    return [(r.actor, r.role, r.via, r.action, r.run_id, r.outcome, r.refusal) for r in
            reversed(sas.store.audit_rows(limit=1000))]


@pytest.mark.both_stores
def test_a_service_submits_reads_and_lists_runs_and_each_submission_is_audited(sas, pump, api, tokens):
    status, doc, _ = call(api, "POST", "/api/v1/runs", tokens["operator"],
                          {"workflow": "three", "business_key": "k-1", "payload": {"n": 1}})
    assert status == 201 and doc["created"] is True
    run_id = doc["run"]["id"]
    assert doc["run"]["links"]["self"] == f"/api/v1/runs/{run_id}"
    again = call(api, "POST", "/api/v1/runs", tokens["operator"],
                 {"workflow": "three", "business_key": "k-1", "payload": {"n": 1}})
    assert (again[0], again[1]["created"], again[1]["run"]["id"]) == (200, False, run_id)
    assert problem(api, "POST", "/api/v1/runs", tokens["operator"],
                   {"workflow": "three", "business_key": "k-1", "payload": {"n": 2}}) == \
        (409, f"business key 'k-1' already names run {run_id} of workflow 'three' with a different payload")
    pump.run()

    status, doc, _ = call(api, "GET", f"/api/v1/runs/{run_id}", tokens["viewer"])
    assert status == 200 and doc["state"] == "processed" and doc["terminal"] is True
    assert [(s["name"], s["state"]) for s in doc["steps"]] == [("first", "completed"), ("second", "completed"),
                                                               ("third", "completed")]
    assert doc["steps"][0]["result"]["step"] == "first" and doc["events"][0]["kind"]

    assert [a[:6] for a in audit(sas)] == [("operator-svc", "operator", "api", "submit", run_id, "done")] * 2 + \
        [("operator-svc", "operator", "api", "submit", None, "refused")]


@pytest.mark.both_stores
def test_runs_are_listed_by_filter_a_page_at_a_time_with_no_run_twice(sas, api, tokens):
    ids = [sas.submit("three", {}, business_key=f"page-{i}").id for i in range(7)]
    sas.submit("saga", {}, business_key="other")
    seen, cursor = [], None
    while True:
        query = {"workflow": "three", "limit": "3", **({"cursor": cursor} if cursor else {})}
        status, doc, _ = call(api, "GET", "/api/v1/runs", tokens["viewer"], **query)
        assert status == 200 and len(doc["runs"]) <= 3
        seen += [r["id"] for r in doc["runs"]]
        cursor = doc["next"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 7
    status, doc, _ = call(api, "GET", "/api/v1/runs", tokens["viewer"], key="page-", since="2000-01-01T00:00:00Z")
    assert len(doc["runs"]) == 7
    assert call(api, "GET", "/api/v1/runs", tokens["viewer"], since="2999-01-01T00:00:00Z")[1]["runs"] == []


def test_an_approver_answers_a_wait_and_may_not_cancel(sas, pump, api, tokens):
    handle = sas.submit("claim", {}, business_key="claim-1")
    pump.run()
    status, detail = problem(api, "POST", f"/api/v1/runs/{handle.id}/cancel", tokens["approver"], {"reason": "no"})
    assert (status, detail) == (403, "approver-svc is approver: cancel of a run needs the operator role or above")
    status, doc, _ = call(api, "POST", f"/api/v1/runs/{handle.id}/signals", tokens["approver"],
                          {"event": "approval", "payload": {"approved": True}})
    assert status == 200 and doc["status"] in ("consumed", "kept")
    pump.run()
    assert handle.status().process_state == "processed"
    assert [a[3:6] for a in audit(sas)] == [("cancel", handle.id, "refused"), ("signal", handle.id, "done")]
    assert sas.store.get_run(handle.id).cancelled_by is None


def test_signal_with_start_starts_the_run_once_and_signals_it(sas, pump, api, tokens):
    body = {"workflow": "claim", "business_key": "claim-2", "payload": {}, "event": "approval",
            "signal": {"approved": True}}
    status, doc, _ = call(api, "POST", "/api/v1/signal-with-start", tokens["operator"], body)
    assert (status, doc["started"], doc["status"]) == (201, True, "kept")
    again = call(api, "POST", "/api/v1/signal-with-start", tokens["operator"], body)
    assert (again[0], again[1]["started"], again[1]["run_id"]) == (200, False, doc["run_id"])
    pump.run()
    assert sas.get_run(doc["run_id"]).process_state == "processed"
    assert len(sas.store.list_runs(workflow="claim")) == 1
    status, detail = problem(api, "POST", "/api/v1/signal-with-start", tokens["operator"],
                             {**body, "business_key": "claim-3", "event": "aproval"})
    assert (status, detail) == (422, "workflow 'claim' waits for no event 'aproval'; it waits for approval")
    assert sas.store.find_run("claim", "claim-3") is None, "nothing started for a signal it could not take"


def test_an_operator_acts_on_runs_with_the_clis_words(sas, pump, api, tokens):
    handle = sas.submit("three", {"script": {"second": ["permanent", "ok"]}}, business_key="op-1")
    pump.run()
    assert handle.status().process_state == "error"
    status, detail = problem(api, "POST", f"/api/v1/runs/{handle.id}/pause", tokens["operator"], {})
    assert (status, detail) == (409, f"cannot pause run {handle.id}: it is error")
    status, doc, _ = call(api, "POST", f"/api/v1/runs/{handle.id}/resubmit", tokens["operator"],
                          {"reason": "card fixed", "step": "second"})
    assert (status, doc["message"]) == (200, f"run {handle.id} resubmitted")
    pump.run()
    assert handle.status().process_state == "processed"
    assert [(e.detail["action"], e.actor, e.detail["reason"]) for e in sas.store.get_events(handle.id)
            if e.kind == "operator"] == [("resubmit", "operator-svc", "card fixed")]
    status, doc, _ = call(api, "GET", f"/api/v1/runs/{handle.id}/wait", tokens["viewer"], timeout="1")
    assert status == 200 and doc["terminal"] is True


def test_hostile_requests_are_refused_naming_the_problem_and_change_nothing(sas, api, tokens):
    op = tokens["operator"]
    before = sas.store.list_runs(limit=100)
    assert problem(api, "GET", "/api/v1/runs") == \
        (401, "send an API token: Authorization: Bearer sas_... (sas token create)")
    assert problem(api, "GET", "/api/v1/runs", "sas_0123456789ab_" + "x" * 43) == (401, "unknown token")
    assert problem(api, "GET", "/api/v1/runs", "not-a-token") == (401, "not a sas_app token (sas_<id>_<secret>)")
    assert problem(api, "GET", "/api/v1/runs", headers={}, token=None, token_in_url=op)[0] == 400
    status, detail = problem(api, "GET", "/api/v1/runs", None, access_token=op)
    assert status == 400 and "never in the URL" in detail
    assert problem(api, "POST", "/api/v1/runs", op, raw="{not json", headers={"Content-Type": "application/json"}
                   )[0] == 400
    assert problem(api, "POST", "/api/v1/runs", op, raw="workflow=three",
                   headers={"Content-Type": "application/x-www-form-urlencoded"})[0] == 415
    status, detail = problem(api, "POST", "/api/v1/runs", op, {"workflow": "three", "business_key": 7,
                                                                "priority": "high", "colour": "red"})
    assert status == 422
    assert "business_key: Input should be a valid string" in detail and "priority:" in detail \
        and "colour: Extra inputs are not permitted" in detail
    status, detail = problem(api, "POST", "/api/v1/runs", op, {"workflow": "nope", "business_key": "k"})
    assert status == 422 and detail.startswith("unknown workflow 'nope'")
    huge = {"workflow": "three", "business_key": "big", "payload": {"blob": "x" * (sas.settings.max_payload_bytes + 1)}}
    assert problem(api, "POST", "/api/v1/runs", op, huge)[0] == 422
    status, detail = problem(api, "POST", "/api/v1/runs", op, raw="[" + "1," * 5_000_000 + "1]",
                             headers={"Content-Type": "application/json"})
    assert status == 413
    status, detail = problem(api, "GET", "/api/v1/runs", op, limit="100000")
    assert status == 422 and "limit: Input should be less than or equal to 500" in detail
    assert problem(api, "GET", "/api/v1/runs", op, cursor="garbage")[0] == 422
    assert problem(api, "GET", "/api/v1/runs/" + "0" * 32, op) == (404, f"no run with id '{'0' * 32}'")
    assert problem(api, "POST", "/api/v1/runs/" + "0" * 32 + "/cancel", op, {})[0] == 404
    assert problem(api, "GET", "/api/v1/runs/nope", op)[0] == 422
    assert problem(api, "GET", "/api/v1/runs", op, state="lost")[0] == 422
    assert problem(api, "GET", "/api/v1/runs", op, since="2026-01-01T00:00:00")[0] == 422  # which zone?
    deep = "[" * 100_000 + "]" * 100_000
    assert problem(api, "POST", "/api/v1/runs", op, raw=deep, headers={"Content-Type": "application/json"})[0] == 400
    assert problem(api, "POST", "/api/v1/runs", op, raw=json.dumps(json.dumps({"workflow": "three"})),
                   headers={"Content-Type": "application/json"}) == (422, "the body must be a JSON object, got str")
    for leaked in (f"/api/v1/runs?{op}", f"/api/v1/runs/{op}/cancel", f"/api/v1/openapi.json?access_token={op}"):
        status, detail = problem(api, "GET", leaked, op)
        assert status == 400 and op not in detail
    assert sas.store.list_runs(limit=100) == before
    assert all(op not in repr(row) for row in sas.store.audit_rows(limit=1000))


def test_an_expired_or_revoked_token_is_refused(sas, api, env):
    _, token = sas.tokens.create("short", "viewer", by="test", lifetime=60)
    assert call(api, "GET", "/api/v1/runs", token)[0] == 200
    env.clock.advance(61)
    assert problem(api, "GET", "/api/v1/runs", token) == (401, "token 'short' has expired")
    _, other = sas.tokens.create("billing", "operator", by="test")
    sas.tokens.revoke("billing", by="alice")
    assert problem(api, "GET", "/api/v1/runs", other) == (401, "token 'billing' was revoked")


def test_the_openapi_document_describes_every_operation(api):
    status, doc, _ = call(api, "GET", "/api/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    paths = doc["paths"]
    assert {"/api/v1/runs", "/api/v1/runs/{run_id}", "/api/v1/runs/{run_id}/wait", "/api/v1/runs/{run_id}/signals",
            "/api/v1/signal-with-start", "/api/v1/runs/batch", "/api/v1/alerts"} <= set(paths)
    assert {f"/api/v1/runs/{{run_id}}/{a}" for a in ("cancel", "compensate", "pause", "resume", "resubmit",
                                                      "mark-done", "rerun")} <= set(paths)
    assert doc["components"]["securitySchemes"]["token"]["scheme"] == "bearer"


def test_an_admin_token_manages_tokens_and_no_other_role_can(sas, api, tokens):
    status, detail = problem(api, "POST", "/api/v1/tokens", tokens["operator"], {"name": "new", "role": "admin"})
    assert (status, detail) == (403, "operator-svc is operator: making a token needs the admin role or above")
    assert problem(api, "GET", "/api/v1/tokens", tokens["operator"])[0] == 403
    status, made, _ = call(api, "POST", "/api/v1/tokens", tokens["admin"],
                           {"name": "reporting", "role": "viewer", "expires_days": 30})
    assert status == 201 and made["about"]["role"] == "viewer" and made["about"]["created_by"] == "admin-svc"
    assert call(api, "GET", "/api/v1/runs", made["token"])[0] == 200
    listed = call(api, "GET", "/api/v1/tokens", tokens["admin"])[1]["tokens"]
    assert made["about"]["id"] in [t["id"] for t in listed] and made["token"] not in json.dumps(listed)
    status, revoked, _ = call(api, "POST", f"/api/v1/tokens/{made['about']['id']}/revoke", tokens["admin"],
                              {"reason": "no longer needed"})
    assert status == 200 and revoked["revoked_by"] == "admin-svc"
    assert problem(api, "GET", "/api/v1/runs", made["token"]) == (401, "token 'reporting' was revoked")
    status, detail = problem(api, "POST", "/api/v1/tokens", tokens["admin"], {"name": "x", "role": "root"})
    assert status == 422 and "role: Input should be 'viewer', 'approver', 'operator' or 'admin'" in detail
    trail = [(r.actor, r.action, r.outcome) for r in reversed(sas.store.audit_rows()) if r.action.startswith("token")]
    assert trail == [("operator-svc", "token_create", "refused"), ("admin-svc", "token_create", "done"),
                     ("admin-svc", "token_revoke", "done")]
