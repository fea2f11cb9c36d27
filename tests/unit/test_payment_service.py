"""The simulated payment service deduplicates by key, fences stale attempts and injects faults."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

import httpx
import pytest

from workers.payment_service import Faults, Ledger, make_handler


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
    return client.post("/charges", json={"order_id": "o1", "amount": amount, "fault": fault},
                       headers={"Idempotency-Key": key, "X-Fencing-Token": str(token)})


def test_a_repeated_key_is_charged_once(service):
    first = charge(service, "k1", 1)
    again = charge(service, "k1", 2)

    assert first.status_code == again.status_code == 200
    assert again.json()["charge_id"] == first.json()["charge_id"]
    assert (first.json()["duplicate"], again.json()["duplicate"]) == (False, True)
    assert [e["idempotency_key"] for e in service.get("/ledger").json()] == ["k1"]


def test_an_older_fencing_token_is_refused(service):
    assert charge(service, "k2", 3).status_code == 200
    zombie = charge(service, "k2", 2)
    assert zombie.status_code == 409
    assert len(service.get("/ledger").json()) == 1
    assert service.get("/refused").json() == {"k2": 1}


def test_transient_faults_fail_the_first_requests_then_charge(service):
    codes = [charge(service, "k3", 1, fault="transient:2").status_code for _ in range(3)]
    assert codes == [503, 503, 200]
    assert len(service.get("/ledger").json()) == 1


def test_a_permanent_fault_never_charges(service):
    assert charge(service, "k4", 1, fault="permanent").status_code == 402
    assert service.get("/ledger").json() == []


def test_a_fault_can_be_limited_to_one_attempt(service):
    assert charge(service, "k5", 2, fault="permanent@1").status_code == 200


def test_bad_requests_are_refused(service):
    assert service.post("/charges", json={"amount": 1}, headers={"Idempotency-Key": "k"}).status_code == 400
    assert service.post("/charges", content=b"not json").status_code == 400
    assert service.get("/nowhere").status_code == 404


def test_a_crashed_service_keeps_its_ledger(tmp_path):
    import subprocess
    import sys

    from tests.integration.stack import free_port
    from tests.support import wait_for

    port = free_port()
    argv = [sys.executable, "-m", "workers.payment_service", "--port", str(port), "--ledger", str(tmp_path / "l.db")]

    def start():
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _up(port), 20, "the payment service to listen")
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
