"""The Kubernetes manifests, run as written: each container's command, arguments and environment
read from ``deploy/kubernetes/example`` and started here as a process against the real PostgreSQL
and Redis — the migration Job first, then one pod of every Deployment — its probes asked as the
kubelet would, orders submitted and found processed, each charge applied once.

What stands in for the cluster, and nothing more: the Secret's placeholders are replaced by the
test's own URLs (as a user fills in the Secret); a Service's ``name:port`` is ``127.0.0.1`` and a
port of the test's own (cluster DNS), so the ``--port`` its pods listen on is that port too; each
pod's ``/tmp`` (an emptyDir) is a folder of its own; ``sas`` is this virtualenv's."""

from __future__ import annotations

import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from sas_app import SasApp, Settings
from sas_app.testing.processes import Processes
from tests.integration.stack import CHECKOUT_PATH, REPO, SAS, free_port
from tests.support import kustomized, wait_for
from workers.orders import install

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "deploy" / "kubernetes" / "example"


class Cluster:
    """The example's objects, and how each container runs here."""

    def __init__(self, home: Path, secrets: dict[str, str]) -> None:
        self.home = home
        self.objects = kustomized(EXAMPLE)
        [config] = self.of("ConfigMap")
        [secret] = self.of("Secret")
        assert set(secret["stringData"]) == set(secrets), "the test fills in every key of the Secret"
        self.values = {config["metadata"]["name"]: config["data"], secret["metadata"]["name"]: secrets}
        #: each Service's in-cluster address, and the local port standing in for it
        self.services = {f"{s['metadata']['name']}:{p['port']}": free_port()
                         for s in self.of("Service") for p in s["spec"]["ports"]}
        self.processes = Processes(home, {"PYTHONPATH": CHECKOUT_PATH}, cwd=REPO)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def pods(self) -> dict[str, dict[str, Any]]:
        """Each Deployment's pod spec, by the Deployment's name."""
        return {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in self.of("Deployment")}

    def local(self, text: str) -> str:
        for address, port in self.services.items():
            text = text.replace(f"//{address}", f"//127.0.0.1:{port}")
        return text

    def port_of(self, name: str, container: dict[str, Any]) -> int | None:
        """The local port of the Service in front of ``name``'s pods, if one is."""
        for service in self.of("Service"):
            if service["metadata"]["name"] == name:
                return self.services[f"{name}:{service['spec']['ports'][0]['port']}"]
        return None

    def env(self, name: str, container: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef") or source["secretRef"]
            env.update(self.values[ref["name"]])
        env.update({e["name"]: e["value"] for e in container.get("env", [])})
        return {k: self.scratch(name, self.local(v)) for k, v in env.items()}

    def scratch(self, name: str, value: str) -> str:
        """``value`` with the pod's ``/tmp`` (its emptyDir) a folder of its own here."""
        if value != "/tmp" and not value.startswith("/tmp/"):
            return value
        (self.home / name).mkdir(exist_ok=True)
        return str(self.home / name) + value.removeprefix("/tmp")

    def argv(self, name: str, command: list[str], container: dict[str, Any]) -> list[str]:
        argv = [SAS if command[0] == "sas" else command[0], *command[1:]]
        port = self.port_of(name, container)
        if port is not None and "--port" in argv:
            argv[argv.index("--port") + 1] = str(port)
        return [argv[0], *(self.scratch(name, a) for a in argv[1:])]

    def start(self, name: str, pod: dict[str, Any]) -> None:
        [container] = pod["containers"]
        self.processes.start(name, self.argv(name, container["command"] + container.get("args", []), container),
                             env=self.env(name, container), wait=False)

    def probe(self, name: str, which: str) -> tuple[bool, str]:
        """Ask ``name``'s probe (``readinessProbe``, ``livenessProbe``) as the kubelet would."""
        [container] = self.pods()[name]["containers"]
        spec = container[which]
        if "exec" in spec:
            try:
                done = subprocess.run(self.argv(name, spec["exec"]["command"], container), capture_output=True,
                                      text=True, env={**self.processes.env, **self.env(name, container)}, cwd=REPO,
                                      timeout=spec["timeoutSeconds"])
            except subprocess.TimeoutExpired:  # a failed probe to the kubelet, asked again next period
                return False, f"timed out after {spec['timeoutSeconds']} s"
            return done.returncode == 0, done.stdout.strip()
        port = self.port_of(name, container)
        try:
            answer = httpx.get(f"http://127.0.0.1:{port}{spec['httpGet']['path']}", timeout=5)
        except httpx.HTTPError as exc:
            return False, str(exc)
        return answer.is_success, answer.text.strip()


@pytest.fixture
def cluster(db_url, redis_url, tmp_path):
    secrets = {"SAS_DATABASE_URL": db_url, "SAS_BROKER_URL": redis_url, "FLOWER_BASIC_AUTH": "ann:pw",
               "SAS_DASHBOARD_SECRET": "same-for-every-replica"}
    c = Cluster(tmp_path, secrets)
    yield c
    c.processes.stop_all(grace=0)


def test_the_manifests_run_as_written_process_orders_and_their_probes_tell_a_dead_worker(cluster, db_url,
                                                                                         redis_url):
    [job] = cluster.of("Job")
    [migration] = job["spec"]["template"]["spec"]["containers"]
    done = subprocess.run(cluster.argv("migrate", migration["command"], migration), capture_output=True, text=True,
                          env={**cluster.processes.env, **cluster.env("migrate", migration)}, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr

    pods = cluster.pods()
    for name, pod in pods.items():
        cluster.start(name, pod)
    with ThreadPoolExecutor(4) as kubelet:  # each pod probed on its own, as the kubelet does
        list(kubelet.map(lambda name: wait_for(lambda: cluster.probe(name, "readinessProbe")[0], 120,
                                               f"{name} ready", interval=1), pods))

    shop = SasApp(Settings(database_url=db_url, broker_url=redis_url))
    install(shop)
    handles = [shop.submit("order", {"amount": 5 + i}, business_key=f"k8s-{i}") for i in range(3)]
    assert [h.wait(60).process_state for h in handles] == ["processed"] * 3
    payment = cluster.services["sas-payment-service:8765"]
    ledger = httpx.get(f"http://127.0.0.1:{payment}/ledger", timeout=5).json()
    assert sorted(e["idempotency_key"] for e in ledger) == sorted(f"{h.id}:charge_payment" for h in handles)
    assert "sas_agent_outstanding" in httpx.get(
        f"http://127.0.0.1:{cluster.services['sas-dashboard:8080']}/metrics", auth=("ann", "pw"), timeout=10).text

    assert cluster.probe("sas-agent-payment", "livenessProbe")[0]
    cluster.processes.kill("sas-agent-payment", signal.SIGKILL)
    with ThreadPoolExecutor(2) as kubelet:
        answers = kubelet.map(lambda which: cluster.probe("sas-agent-payment", which), ("readinessProbe",
                                                                                        "livenessProbe"))
    for ok, said in answers:
        assert not ok and said.startswith("unhealthy: worker: payment@") and "did not answer" in said
    assert cluster.probe("sas-agent-fraud", "readinessProbe")[0]  # the others are still ready
    shop.store.dispose()
