"""The HTTP API as a service in another language uses it: ``sas dashboard`` serving it, a token
from ``sas token create``, the order example's workers on PostgreSQL and Redis, and requests sent
by curl and httpx."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading

import httpx
import pytest

from tests.integration.stack import SAS, Ready, free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def served(stack, shop):
    """The example's stack, its dashboard with the API (2 threads: one request may wait for a run
    at a time), and an operator's and a viewer's token."""
    stack.up()
    port = free_port()
    stack.start("dashboard", [SAS, "dashboard", "--port", str(port), "--threads", "2"],
                ready=Ready(url=f"http://127.0.0.1:{port}/healthz"))

    def token(role: str) -> str:
        made = subprocess.run([SAS, "token", "create", "--role", role, "--name", f"{role}-svc"], env=stack.env,
                              capture_output=True, text=True, timeout=60, check=True)
        return made.stdout.strip()

    return f"http://127.0.0.1:{port}/api/v1", token("operator"), token("viewer")


def curl(*args: str) -> tuple[int, dict]:
    """What a runbook's curl gets: the status and the JSON body."""
    assert shutil.which("curl"), "curl is needed (apt-get install curl)"
    done = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", *args], capture_output=True, text=True, timeout=90,
                          check=True)
    body, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(body)


def test_a_runbooks_curl_submits_an_order_waits_for_it_and_reads_it(served, stack):
    api, operator, viewer = served
    auth = f"Authorization: Bearer {operator}"
    status, made = curl("-H", auth, "-H", "Content-Type: application/json", "-d",
                        json.dumps({"workflow": "order", "business_key": "api-1", "payload": {"amount": 12.5}}),
                        f"{api}/runs")
    assert status == 201 and made["created"] is True
    run_id = made["run"]["id"]
    status, ended = curl("-H", f"Authorization: Bearer {viewer}", f"{api}/runs/{run_id}/wait?timeout=30")
    assert (status, ended["state"], ended["terminal"]) == (200, "processed", True)
    assert [s["state"] for s in ended["steps"]].count("completed") == len(ended["steps"]) >= 5
    assert [e["order_id"] for e in stack.ledger("payment") if e["action"] == "charge"] == ["api-1"]

    status, page = curl("-H", f"Authorization: Bearer {viewer}", f"{api}/runs?workflow=order&key=api-&limit=10")
    assert status == 200 and [r["id"] for r in page["runs"]] == [run_id]
    status, refused = curl("-H", f"Authorization: Bearer {viewer}", "-X", "POST", "-H",
                           "Content-Type: application/json", "-d", "{}", f"{api}/runs/{run_id}/cancel")
    assert status == 403 and refused["detail"] == "viewer-svc is viewer: cancel of a run needs the operator role " \
                                                  "or above"


def test_held_orders_are_approved_or_started_and_approved_in_one_request_and_waits_are_bounded(served):
    api, operator, viewer = served
    as_operator, as_viewer = {"Authorization": f"Bearer {operator}"}, {"Authorization": f"Bearer {viewer}"}
    held = httpx.post(f"{api}/runs", headers=as_operator, timeout=30,
                      json={"workflow": "held_order", "business_key": "api-held", "payload": {"amount": 900}})
    assert held.status_code == 201
    run_id = held.json()["run"]["id"]

    # two requests wait for it at once on a two-thread server: one waits its 3 s, the other is told to retry
    answers: list[httpx.Response] = []

    def wait() -> None:
        answers.append(httpx.get(f"{api}/runs/{run_id}/wait", params={"timeout": 3}, headers=as_viewer, timeout=30))

    waiters = [threading.Thread(target=wait) for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join(30)
    by_status = {a.status_code: a for a in answers}
    assert sorted(by_status) == [200, 503], [a.text for a in answers]
    assert by_status[200].json()["terminal"] is False and by_status[503].headers["Retry-After"] == "1"

    review = {"event": "review", "signal": {"approved": True, "by": "billing"}, "workflow": "held_order"}
    found = httpx.post(f"{api}/signal-with-start", headers=as_operator, timeout=30,
                       json={**review, "business_key": "api-held"})
    assert (found.status_code, found.json()["started"], found.json()["run_id"]) == (200, False, run_id)
    started = httpx.post(f"{api}/signal-with-start", headers=as_operator, timeout=30,
                         json={**review, "business_key": "api-held-2", "payload": {"amount": 950}})
    assert (started.status_code, started.json()["started"], started.json()["status"]) == (201, True, "kept")
    for held_id in (run_id, started.json()["run_id"]):
        ended = httpx.get(f"{api}/runs/{held_id}/wait", params={"timeout": 40}, headers=as_viewer, timeout=60)
        assert ended.json()["state"] == "processed", ended.text
