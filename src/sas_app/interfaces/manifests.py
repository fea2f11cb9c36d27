"""``sas kubernetes``: the Kubernetes manifests of a deployment of this app, written from what the
app declares — one Deployment per agent, each given the grace period its longest step needs.

What is written (a kustomization; ``kubectl apply -k DIR``):

* ``config.yaml`` — a ConfigMap of the settings every process shares (``SAS_APP``, ``SAS_HOME``,
  and any ``--env``); ``secret.yaml`` — a Secret holding the URLs and passwords, written with
  placeholders only when the folder has none (a filled-in one is never replaced), and left out
  with ``secret=False`` for a Secret made another way;
* ``migrate.yaml`` — a Job running ``sas migrate`` (safe to run again), named after the schema
  revision and the image: a Job's pod cannot be changed, so a new image is a new Job, which runs;
* ``scheduler.yaml`` — the Scheduler and Supervisor's workers (``sas.scheduler``, ``sas.supervisor``);
* ``agent-<name>.yaml`` — one Deployment per agent on ``sas.agent.<name>`` (its Kubernetes name
  the agent's in lower case, ``_`` as ``-``: :func:`kube_name`), its
  ``terminationGracePeriodSeconds`` the agent's longest step timeout plus :data:`DRAIN_MARGIN`:
  a scale-down's SIGTERM starts Celery's warm shutdown, which lets every step in hand finish
  (an agent gives up a step at its complete-by) before the pod is killed;
* ``beat.yaml`` (one replica, replaced rather than rolled: beat sends the Supervisor's sweeps),
  ``dashboard.yaml`` and ``flower.yaml`` (each with its Service);
* a PodDisruptionBudget beside each worker's Deployment: a voluntary disruption (a node's drain)
  takes its pods one at a time;
* ``keda/`` — a KEDA ``ScaledObject`` per agent, scaling its Deployment on the steps it has to do
  (``sas_agent_outstanding``, from the state store: :mod:`sas_app.store.backlog`), in a
  kustomization of its own for clusters that run KEDA.

Workers are probed with ``sas health``: ready once the database, the schema, the broker and the
worker itself answer; alive while the worker answers (a broker that is down is not held against
it). The dashboard answers ``/healthz`` and ``/livez``, Flower ``/healthcheck``.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sas_app.definitions.steps import action_name
from sas_app.definitions.workflow import Workflow
from sas_app.messaging.routing import SCHEDULER_QUEUE, SUPERVISOR_QUEUE, agent_queue
from sas_app.store.migrate import SCHEMA_HEAD

#: seconds a worker is given past its longest step to reply, hand back what it has not started
#: and close its connections, after Kubernetes's SIGTERM
DRAIN_MARGIN = 30
#: the Secret's keys, with placeholders that fail loudly until replaced
SECRET_PLACEHOLDERS = {
    "SAS_DATABASE_URL": "postgresql+psycopg2://sas:CHANGE-ME@postgres:5432/sas",
    "SAS_BROKER_URL": "redis://:CHANGE-ME@redis:6379/0",
    "FLOWER_BASIC_AUTH": "admin:CHANGE-ME",
    "SAS_DASHBOARD_SECRET": "CHANGE-ME",
}
DASHBOARD_PORT = 8080
FLOWER_PORT = 5555
#: the scratch space every container writes to (beat's schedule, Celery's files); the root file
#: system is read-only
SCRATCH = "/tmp"
#: a Kubernetes object or container name (an RFC 1123 label)
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class ManifestError(ValueError):
    """What ``sas kubernetes`` cannot write for this app, and why."""


def kube_name(agent: str) -> str:
    """``agent`` as Kubernetes names its objects and containers: lower case, ``_`` as ``-``."""
    return agent.lower().replace("_", "-")


@dataclass(frozen=True)
class Options:
    """What ``sas kubernetes`` is told: the image, the app (``module:attribute``), settings added to
    the ConfigMap, each agent's worker processes per pod (``-c``; ``default_concurrency`` for an
    agent not named: SAS_AGENT_CONCURRENCY), replicas, and the Prometheus KEDA asks for the backlog."""

    image: str
    app: str
    name: str = "sas"
    env: dict[str, str] = field(default_factory=dict)
    concurrency: dict[str, int] = field(default_factory=dict)
    default_concurrency: int = 4
    replicas: int = 2
    prometheus: str = "http://prometheus-server.monitoring.svc:80"
    #: write the Secret (placeholders) and list it in the kustomization
    secret: bool = True


def longest_steps(agents: Iterable[str], workflows: Iterable[Workflow]) -> dict[str, float]:
    """Each agent's longest step timeout (an undo is sent with its step's), over ``workflows``; an
    agent no workflow uses yet gets the default step timeout."""
    longest = dict.fromkeys(agents, 0.0)
    for workflow in workflows:
        for spec in workflow.specs:
            for ref in (spec.action, spec.compensate):
                if ref is None:
                    continue
                agent = action_name(ref).split(".", 1)[0]
                longest[agent] = max(longest.get(agent, 0.0), spec.timeout)
    return {agent: seconds or 30.0 for agent, seconds in longest.items()}


class Manifests:
    """The manifests of a deployment whose agents' longest steps are ``longest`` (seconds, by
    agent: :func:`longest_steps`), as ``{file name: [documents]}``."""

    def __init__(self, longest: Mapping[str, float], options: Options) -> None:
        self.longest = dict(sorted(longest.items()))
        self.o = options
        self.names: dict[str, str] = {}
        for agent in self.longest:
            name = kube_name(agent)
            if name in self.names.values():
                other = next(a for a, n in self.names.items() if n == name)
                raise ManifestError(f"agents {other!r} and {agent!r} would both be named {name!r} in Kubernetes "
                                    "(lower case, '_' as '-'): rename one")
            self.names[agent] = name
        for document in (d for documents in self.files().values() for d in documents if "metadata" in d):
            named = document["metadata"]["name"]
            if not _LABEL.fullmatch(named) or len(named) > 63:
                owner = next((a for a, n in self.names.items() if named.endswith(f"-agent-{n}")), None)
                raise ManifestError(
                    f"the {document['kind']} would be named {named!r}: Kubernetes wants at most 63 lower-case "
                    "letters, digits and '-', starting and ending with a letter or digit; "
                    + (f"rename the agent {owner!r} or " if owner else "") + "shorten --name")

    def concurrency(self, agent: str) -> int:
        return self.o.concurrency.get(agent, self.o.default_concurrency)

    def files(self) -> dict[str, list[dict[str, Any]]]:
        o = self.o
        files: dict[str, list[dict[str, Any]]] = {
            "config.yaml": [self._meta("ConfigMap", f"{o.name}-config", data={
                "SAS_APP": o.app, "SAS_HOME": f"{SCRATCH}/sas", **o.env})],
            **({"secret.yaml": [self._meta("Secret", f"{o.name}-secrets", type="Opaque",
                                           stringData=dict(SECRET_PLACEHOLDERS))]} if o.secret else {}),
            "migrate.yaml": [self._migrate()],
            "scheduler.yaml": self._worker("scheduler", f"{SCHEDULER_QUEUE},{SUPERVISOR_QUEUE}",
                                           o.default_concurrency, grace=DRAIN_MARGIN * 2),
        }
        for agent, seconds in self.longest.items():
            files[f"agent-{self.names[agent]}.yaml"] = self._worker(
                f"agent-{self.names[agent]}", agent_queue(agent), self.concurrency(agent), node=agent,
                grace=math.ceil(seconds) + DRAIN_MARGIN)
        files["beat.yaml"] = [self._deployment(
            "beat", ["sas", "beat", "--schedule", f"{SCRATCH}/sas/celerybeat-schedule"], replicas=1,
            grace=DRAIN_MARGIN, probes={"readinessProbe": self._exec(["sas", "health"])},
            strategy={"type": "Recreate"})]
        files["dashboard.yaml"] = self._web(
            "dashboard", ["sas", "dashboard", "--host", "0.0.0.0", "--port", str(DASHBOARD_PORT)],
            DASHBOARD_PORT, ready="/healthz", alive="/livez")
        files["flower.yaml"] = self._web(
            "flower", ["sas", "flower", "--host", "0.0.0.0", "--port", str(FLOWER_PORT)],
            FLOWER_PORT, ready="/healthcheck", alive="/healthcheck")
        files["kustomization.yaml"] = [{"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                                        "resources": sorted(files)}]
        for agent in self.longest:
            files[f"keda/scaledobject-{self.names[agent]}.yaml"] = [self._scaled_object(agent)]
        files["keda/kustomization.yaml"] = [{
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": sorted(name.split("/", 1)[1] for name in files if name.startswith("keda/scaledobject-"))}]
        return files

    def kept_secret_differs(self, out: Path) -> str | None:
        """What a ``secret.yaml`` already in ``out`` (kept by :meth:`write`) lacks that the
        manifests expect — the Secret's name, a key — or None."""
        path = out / "secret.yaml"
        if not self.o.secret or not path.exists():
            return None
        try:
            [kept] = yaml.safe_load_all(path.read_text())
            name, keys = kept["metadata"]["name"], set(kept.get("stringData") or {}) | set(kept.get("data") or {})
        except (yaml.YAMLError, ValueError, KeyError, TypeError):
            return "it is not one Secret"
        if name != f"{self.o.name}-secrets":
            return f"it names the Secret {name!r}, the pods read {self.o.name}-secrets"
        missing = sorted(set(SECRET_PLACEHOLDERS) - keys)
        return f"it has no {', '.join(missing)}" if missing else None

    def write(self, out: Path) -> list[Path]:
        """Write every file under ``out`` (its own files replaced, but for a ``secret.yaml`` already
        there: it may hold the real passwords; nothing else touched). The files written."""
        written = []
        for name, documents in self.files().items():
            path = out / name
            if name == "secret.yaml" and path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            header = f"# Written by `sas kubernetes` for {self.o.app}; edit the command's options, not this file.\n"
            path.write_text(header + yaml.safe_dump_all(documents, sort_keys=False, width=110))
            written.append(path)
        return written

    # -- the pieces -----------------------------------------------------------------------------

    def _labels(self, component: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.o.name, "app.kubernetes.io/component": component}

    def _meta(self, kind: str, name: str, component: str = "config", **rest: Any) -> dict[str, Any]:
        api = {"Deployment": "apps/v1", "Job": "batch/v1", "PodDisruptionBudget": "policy/v1"}.get(kind, "v1")
        return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "labels": self._labels(component)}, **rest}

    def _container(self, name: str, command: list[str]) -> dict[str, Any]:
        o = self.o
        return {
            "name": name, "image": o.image, "command": command,
            "envFrom": [{"configMapRef": {"name": f"{o.name}-config"}}, {"secretRef": {"name": f"{o.name}-secrets"}}],
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH}],
        }

    def _pod(self, component: str, container: dict[str, Any], grace: int, restart: str = "Always") -> dict[str, Any]:
        return {
            "metadata": {"labels": self._labels(component)},
            "spec": {"terminationGracePeriodSeconds": grace, "restartPolicy": restart,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [container], "volumes": [{"name": "scratch", "emptyDir": {}}]},
        }

    def _deployment(self, component: str, command: list[str], *, replicas: int, grace: int,
                    probes: dict[str, Any], strategy: dict[str, Any] | None = None,
                    ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        container = {**self._container(component, command), **probes}
        if ports:
            container["ports"] = ports
        strategy = strategy or {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        return self._meta("Deployment", f"{self.o.name}-{component}", component, spec={
            "replicas": replicas, "selector": {"matchLabels": self._labels(component)}, "strategy": strategy,
            "template": self._pod(component, container, grace)})

    @staticmethod
    def _exec(command: list[str], period: int = 30, timeout: int = 20, failures: int = 3,
              delay: int = 10) -> dict[str, Any]:
        return {"exec": {"command": command}, "initialDelaySeconds": delay, "periodSeconds": period,
                "timeoutSeconds": timeout, "failureThreshold": failures}

    def _worker(self, component: str, queues: str, concurrency: int, *, grace: int,
                node: str | None = None) -> list[dict[str, Any]]:
        node = f"{node or component}@%h"  # %h: the pod's host name, which Celery and sas health expand alike
        command = ["sas", "worker", "-Q", queues, "-c", str(concurrency), "-n", node]
        probes = {"readinessProbe": self._exec(["sas", "health", "--worker", node]),
                  "livenessProbe": self._exec(["sas", "health", "--worker", node, "--alive"], period=60,
                                              timeout=30, failures=5, delay=60)}
        return [self._deployment(component, command, replicas=self.o.replicas, grace=grace, probes=probes),
                self._budget(component)]

    def _web(self, component: str, command: list[str], port: int, *, ready: str, alive: str) -> list[dict[str, Any]]:
        probes = {"readinessProbe": {"httpGet": {"path": ready, "port": "http"}, "periodSeconds": 10},
                  "livenessProbe": {"httpGet": {"path": alive, "port": "http"}, "periodSeconds": 30,
                                    "failureThreshold": 5}}
        deployment = self._deployment(component, command, replicas=1, grace=DRAIN_MARGIN, probes=probes,
                                      ports=[{"name": "http", "containerPort": port}])
        service = self._meta("Service", f"{self.o.name}-{component}", component, spec={
            "selector": self._labels(component), "ports": [{"name": "http", "port": port, "targetPort": "http"}]})
        return [deployment, service]

    def _budget(self, component: str) -> dict[str, Any]:
        return self._meta("PodDisruptionBudget", f"{self.o.name}-{component}", component, spec={
            "maxUnavailable": 1, "selector": {"matchLabels": self._labels(component)}})

    def _migrate(self) -> dict[str, Any]:
        pod = self._pod("migrate", self._container("migrate", ["sas", "migrate"]), DRAIN_MARGIN, restart="OnFailure")
        image = hashlib.sha256(self.o.image.encode()).hexdigest()[:8]
        return self._meta("Job", f"{self.o.name}-migrate-{SCHEMA_HEAD}-{image}", "migrate", spec={
            "backoffLimit": 10, "ttlSecondsAfterFinished": 600, "template": pod})

    def _scaled_object(self, agent: str) -> dict[str, Any]:
        # No cooldownPeriod: KEDA applies it only to scaling to zero, and these keep one pod. A pod
        # scaled away drains within its grace period (each step in hand ends by its complete-by).
        name = f"{self.o.name}-agent-{self.names[agent]}"
        return {
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": name, "labels": self._labels(f"agent-{self.names[agent]}")},
            "spec": {
                "scaleTargetRef": {"name": name},
                "minReplicaCount": 1, "maxReplicaCount": 20, "pollingInterval": 15,
                "triggers": [{"type": "prometheus", "metadata": {
                    "serverAddress": self.o.prometheus,
                    # every dashboard serves the same gauge: max, not sum
                    "query": f'max(sas_agent_outstanding{{agent="{agent}"}})',
                    # pods = ceil(outstanding steps / worker processes per pod)
                    "threshold": str(self.concurrency(agent)),
                    # no series (Prometheus not scraping the dashboard) is an error KEDA reports,
                    # and the Deployment keeps its pods, rather than a zero that scales it down
                    "ignoreNullValues": "false"}}],
            },
        }
