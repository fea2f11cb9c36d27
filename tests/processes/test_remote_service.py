"""The simulated remote service: effects once per key, stale attempts fenced out, undo once,
an undo before its effect leaves a tombstone, faults injected, the ledger survives a crash."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer

import httpx
import pytest

from sas_app.testing.processes import free_port
from tests.support import wait_for
from workers.remote_service import Faults, Ledger, make_handler

pytestmark = pytest.mark.integration  # real processes


@pytest.fixture
def service(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(Ledger(tmp_path / "ledger.db"), Faults(1)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}", timeout=5) as client:
        yield client
    server.shutdown()
    server.server_close()


def charge(client, key, token, fault=None, amount=10):
    return client.post("/do/charge", json={"order_id": "o1", "amount": amount, "fault": fault},
                       headers={"Idempotency-Key": key, "X-Fencing-Token": str(token)})


def refund(client, key, do_key, token=1):
    return client.post("/undo/charge", json={"order_id": "o1", "do_key": do_key},
                       headers={"Idempotency-Key": key, "X-Fencing-Token": str(token)})


def test_a_repeated_key_is_applied_once(service):
    first = charge(service, "k1", 1)
    again = charge(service, "k1", 2)

    assert first.status_code == again.status_code == 200
    assert again.json()["effect_id"] == first.json()["effect_id"]
    assert (first.json()["duplicate"], again.json()["duplicate"]) == (False, True)
    assert [e["idempotency_key"] for e in service.get("/ledger").json()] == ["k1"]


def test_an_older_fencing_token_is_refused(service):
    assert charge(service, "k2", 3).status_code == 200
    zombie = charge(service, "k2", 2)
    assert zombie.status_code == 409
    assert len(service.get("/ledger").json()) == 1
    assert service.get("/refused").json() == {"k2": 1}


def test_an_undo_is_applied_once_and_marks_its_effect(service):
    charge(service, "k3", 1)
    assert refund(service, "k3:undo", "k3").status_code == 200
    assert refund(service, "k3:undo", "k3", token=2).json()["duplicate"] is True

    ledger = {e["idempotency_key"]: e for e in service.get("/ledger").json()}
    assert ledger["k3"]["undone_by"] == "k3:undo"
    assert (ledger["k3:undo"]["action"], ledger["k3:undo"]["undoes"], ledger["k3:undo"]["amount"]) == \
        ("undo:charge", "k3", 10)


def test_an_undo_before_its_effect_leaves_a_tombstone(service):
    assert refund(service, "k4:undo", "k4").status_code == 200
    late = charge(service, "k4", 1)

    assert late.status_code == 409 and "undone before it was done" in late.json()["error"]
    ledger = service.get("/ledger").json()
    assert [(e["action"], e["undoes"]) for e in ledger] == [("undo:charge", None)]


def test_transient_faults_fail_the_first_requests_then_apply(service):
    codes = [charge(service, "k5", 1, fault="transient:2").status_code for _ in range(3)]
    assert codes == [503, 503, 200]
    assert len(service.get("/ledger").json()) == 1


def test_a_permanent_fault_never_applies(service):
    assert charge(service, "k6", 1, fault="permanent").status_code == 422
    assert service.get("/ledger").json() == []


def test_a_fault_can_be_limited_to_one_attempt(service):
    assert charge(service, "k7", 2, fault="permanent@1").status_code == 200


def test_bad_requests_are_refused(service):
    assert service.post("/do/charge", json={"amount": 1}, headers={"Idempotency-Key": "k"}).status_code == 400
    assert service.post("/do/charge", content=b"not json").status_code == 400
    assert service.post("/undo/charge", json={"order_id": "o"},
                        headers={"Idempotency-Key": "k", "X-Fencing-Token": "1"}).status_code == 400
    assert service.get("/nowhere").status_code == 404


def test_a_crashed_service_keeps_its_ledger(tmp_path):
    port = free_port()
    argv = [sys.executable, "-m", "workers.remote_service", "--port", str(port), "--ledger", str(tmp_path / "l.db")]

    def start():
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _up(port), 20, "the service to listen")
        return proc

    proc = start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5)
    assert charge(client, "before", 1).status_code == 200
    with pytest.raises(httpx.TransportError):
        charge(client, "boom", 1, fault="crash@1")
    assert proc.wait(10) == 3

    proc = start()
    try:
        assert [e["idempotency_key"] for e in client.get("/ledger").json()] == ["before"]
        assert charge(client, "boom", 2, fault="crash@1").status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)
        client.close()


def _up(port):
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
