"""What a fleet runs on: each agent's backlog read from the state store (``sas backlog``, the
Prometheus gauges a ScaledObject scales on), ``sas health`` (a probe's check of one process), the
dashboard's ``/healthz`` and ``/livez``, and ``sas kubernetes`` (the manifests, valid against
Kubernetes's schemas, each agent's grace period from its longest step, and the committed ones
those the command writes today)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import kubernetes_validate
import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest
from werkzeug.test import Client

from sas_app import AgentCall, PermanentError, SasApp, Settings, Step, Workflow
from sas_app.cli import main
from sas_app.interfaces.manifests import DRAIN_MARGIN, longest_steps
from sas_app.store.backlog import backlog
from sas_app.testing import Environment
from sas_app.web.metrics import registry_for
from sas_app.web.site import create_site
from tests.support import kustomized

REPO = Path(__file__).resolve().parents[2]
#: the Kubernetes version the manifests are checked against
KUBERNETES = "1.30"

#: the app the commands load here (``--app tests.unit.test_fleet:CLI_APP``)
CLI_APP: SasApp | None = None


@pytest.mark.both_stores
def test_the_backlog_counts_each_agents_steps_due_dispatched_and_retrying_from_the_store(sas, pump):
    for n in range(3):  # three runs whose first step is dispatched: three messages wait for svc
        sas.submit("three", {}, business_key=f"wait-{n}")
    sas.submit("three", {"script": {"first": ["deferred", "ok"]}}, business_key="deferred")
    pump.run(["sas.scheduler"])
    [svc] = backlog(sas.store, ("svc", "idle"))[1:]
    assert (svc.agent, svc.due, svc.dispatched, svc.retrying, svc.outstanding) == ("svc", 0, 4, 0, 4)
    assert backlog(sas.store, ("idle",))[0].as_dict() == {"agent": "idle", "due": 0, "dispatched": 0, "retrying": 0,
                                                           "oldest": 0.0, "outstanding": 0}
    deferred = [m for m in pump.take("sas.agent.svc") if m.kwargs["position"] == 0]
    for message in deferred:
        pump.execute(message)  # each first step runs; the deferred one's breaker is open
    for reply in pump.take("sas.scheduler"):  # the replies, once: the deferred step's retry stays held
        pump.execute(reply)
    [svc] = backlog(sas.store, ())
    assert (svc.dispatched, svc.retrying) == (3, 1)  # the deferred step backs off: not outstanding



@pytest.mark.both_stores
def test_the_backlog_leaves_out_steps_no_worker_could_take_a_paused_runs_and_undos_queued_behind_one(
        settings, db_url):
    """A scaler adds pods for outstanding steps: a step of a paused run, its back-off over, and the
    undos waiting behind the one being done cannot be sent however many pods there are, so they
    are not outstanding (they were: a paused incident held every agent scaled up)."""
    user = SasApp(settings)
    x, y, z = user.agent("x"), user.agent("y"), user.agent("z")

    @x.action
    def a(call: AgentCall) -> int:
        return 1

    @x.undo
    def undo_a(call: AgentCall) -> int:
        return 1

    @y.action
    def c(call: AgentCall) -> int:
        return 1

    @y.undo
    def undo_c(call: AgentCall) -> int:
        return 1

    @z.action
    def d(call: AgentCall) -> int:
        raise PermanentError("declined")

    user.register(Workflow("undone", [Step("a", a, compensate=undo_a, timeout=30),
                                      Step("b", a, compensate=undo_a, timeout=30),
                                      Step("c", c, compensate=undo_c, timeout=30), Step("d", d, timeout=30)]))
    user.register(Workflow("held", [Step("a", a, timeout=30, max_failures=5)]))
    with Environment(user, database_url=None if db_url.startswith("sqlite") else db_url) as env:
        env.stub(undo_c, hangs=True)  # the first undo (last step first) is being done, and hangs
        undone = env.start("undone", {})
        assert [s.name for s in undone.steps if s.name.startswith("undo:") and s.state == "pending"
                and s.attempt == 0] == ["undo:b", "undo:a"]  # queued behind undo:c
        env.stub(a, hangs=True)
        held = env.start("held", {})
        env.app.pause(held.id, by="ops", reason="incident")
        env.unstub(a)
        env.advance(600)  # the paused run's step's back-off is long over
        env.settle()
        assert env.get_run(held.id).steps[0].state == "pending"
        counts = {b.agent: (b.due, b.dispatched, b.outstanding) for b in backlog(env.app.store, ("x", "y", "z"))}
        assert counts["x"] == (0, 0, 0), counts
        env.app.resume(held.id, by="ops")
        assert backlog(env.app.store, ("x",))[0].outstanding == 1  # resumed: the step is the agent's again


def test_the_gauges_a_scaled_object_reads_give_each_agents_outstanding_steps(sas, pump):
    sas.submit("three", {}, business_key="one")
    sas.submit("three", {}, business_key="two")
    pump.run(["sas.scheduler"])
    text = generate_latest(registry_for(sas)).decode()
    assert 'sas_agent_outstanding{agent="svc"} 2.0' in text
    assert 'sas_agent_backlog{agent="svc",state="dispatched"} 2.0' in text
    assert 'sas_agent_backlog{agent="svc",state="retrying"} 0.0' in text


@pytest.fixture
def sas_cli(tmp_path):
    global CLI_APP
    CLI_APP = SasApp(Settings(home=tmp_path / "home", broker_url="memory://localhost/",
                              database_url=f"sqlite:///{tmp_path / 'state.db'}"))
    runner = CliRunner()

    def run(*args: str, code: int = 0):
        result = runner.invoke(main, ["--app", "tests.unit.test_fleet:CLI_APP", *args])
        assert result.exit_code == code, result.output
        return result

    yield run
    CLI_APP.store.dispose()


def test_sas_health_says_in_one_line_why_a_process_is_not_ready_and_exits_1(sas_cli):
    assert sas_cli("health", code=1).output == \
        "unhealthy: schema: the state store has no schema yet: run `sas migrate`\n"
    CLI_APP.migrate()
    assert sas_cli("health").output == "ok: database, schema and broker answer\n"
    silent = sas_cli("health", "--worker", "nobody@%h", "--timeout", "0.3", code=1).output
    assert silent.startswith("unhealthy: worker: nobody@") and "did not answer within 0.3 s" in silent
    assert "nobody@%h" not in silent  # %h is this host's name, as Celery's -n expands it
    assert "--alive checks a worker" in sas_cli("health", "--alive", code=2).output


@pytest.mark.integration  # the sas command, run as a user would
def test_sas_health_gives_up_on_a_database_that_never_answers_within_its_timeout(tmp_path):
    """A probe against a PostgreSQL that accepts the connection and never answers (a hung server,
    a proxy whose backend is gone) says so in one line and exits 1, instead of outlasting the
    kubelet's own timeout with nothing said. Run as a process, as the kubelet runs it: a probe
    that hung would be killed here after 30 s, and the test fail."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nothing ever answers
        env = {**os.environ, "SAS_HOME": str(tmp_path / "home"), "SAS_BROKER_URL": "memory://localhost/",
               "SAS_DATABASE_URL": f"postgresql+psycopg2://sas@127.0.0.1:{silent.getsockname()[1]}/sas"}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "sas_app.cli", "health", "--timeout", "1"], env=env,
                              capture_output=True, text=True, timeout=30)
        took = time.monotonic() - started
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("unhealthy: database: ") and "timeout expired" in done.stdout
    assert took < 15  # libpq's connect_timeout: whole seconds, at least 2; and the process's start


@pytest.mark.integration  # the sas command, run as a user would
def test_sas_doctor_gives_up_on_a_database_that_never_answers_after_the_connect_timeout(tmp_path):
    """Every connection the store opens gives up after ten seconds unless the URL says otherwise
    (libpq's ``connect_timeout``): ``sas doctor``, a worker or ``sas migrate`` against a server
    that accepted the connection and never answers reports it instead of waiting without end."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"postgresql+psycopg2://sas@127.0.0.1:{silent.getsockname()[1]}/sas"
        env = {**os.environ, "SAS_HOME": str(tmp_path / "home"), "SAS_BROKER_URL": "memory://localhost/"}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "sas_app.cli", "doctor"], env={**env, "SAS_DATABASE_URL": url},
                              capture_output=True, text=True, timeout=40)
        took_default = time.monotonic() - started
        assert done.returncode == 1, done.stdout + done.stderr
        assert "timeout expired" in done.stdout + done.stderr
        assert 9 < took_default < 30  # the default's ten seconds, and the process's start
        started = time.monotonic()
        own = subprocess.run([sys.executable, "-m", "sas_app.cli", "migrate"],
                             env={**env, "SAS_DATABASE_URL": url + "?connect_timeout=2"},
                             capture_output=True, text=True, timeout=40)
        took_own = time.monotonic() - started
    assert own.returncode != 0 and "timeout expired" in own.stdout + own.stderr
    # the URL's own two seconds, not the default's ten (each command's start on either side)
    assert took_own < took_default - 5, (took_own, took_default)


def test_sas_backlog_prints_each_agents_counts_as_json(sas_cli):
    CLI_APP.migrate()
    CLI_APP.agent("payment")
    assert json.loads(sas_cli("backlog", "--json").output) == {"agents": {"payment": {
        "agent": "payment", "due": 0, "dispatched": 0, "retrying": 0, "oldest": 0.0, "outstanding": 0}}}


def test_the_dashboards_probes_answer_without_a_password_and_say_why_it_is_not_ready(tmp_path):
    app = SasApp(Settings(home=tmp_path / "home", broker_url="memory://localhost/",
                          database_url=f"sqlite:///{tmp_path / 'state.db'}"))
    client = Client(create_site(app, basic_auth={"ann": "pw"}))
    assert client.get("/livez").status_code == 200
    not_ready = client.get("/healthz")
    assert (not_ready.status_code, not_ready.text) == (503, "the state store has no schema yet: run `sas migrate`\n")
    app.migrate()
    assert (client.get("/healthz").status_code, client.get("/healthz").text) == (200, "ok\n")
    assert client.get("/").status_code == 401  # the rest still asks who you are
    app.store.dispose()


# -- the manifests -----------------------------------------------------------------------------


def regenerate(out: Path) -> None:
    """``deploy/kubernetes/regenerate`` writes the example's base manifests, as a user would."""
    subprocess.run(["bash", str(REPO / "deploy" / "kubernetes" / "regenerate"), str(out)], check=True,
                   env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "SAS_HOME": str(out.parent / "home")},
                   capture_output=True)


@pytest.mark.integration  # the sas command, run as a user would
def test_the_committed_manifests_are_what_sas_kubernetes_writes_for_the_example_today(tmp_path):
    regenerate(tmp_path / "base")
    committed = REPO / "deploy" / "kubernetes" / "base"
    written = sorted(p.relative_to(tmp_path / "base") for p in (tmp_path / "base").rglob("*.yaml"))
    assert written == sorted(p.relative_to(committed) for p in committed.rglob("*.yaml"))
    for name in written:
        assert (tmp_path / "base" / name).read_text() == (committed / name).read_text(), \
            f"deploy/kubernetes/base/{name} is stale: run deploy/kubernetes/regenerate"


def test_the_manifests_are_valid_kubernetes_objects_with_probes_budgets_and_grace_periods():
    example = kustomized(REPO / "deploy" / "kubernetes" / "example")
    for document in example:
        kubernetes_validate.validate(document, KUBERNETES, strict=True)
    deployments = {d["metadata"]["name"]: d for d in example if d["kind"] == "Deployment"}
    assert set(deployments) >= {"sas-scheduler", "sas-beat", "sas-dashboard", "sas-flower", "sas-agent-payment",
                                "sas-agent-fraud", "sas-agent-warehouse", "sas-agent-orders"}
    budgets = {d["metadata"]["name"] for d in example if d["kind"] == "PodDisruptionBudget"}
    assert budgets == {"sas-scheduler", "sas-agent-payment", "sas-agent-fraud", "sas-agent-warehouse",
                       "sas-agent-orders"}
    assert any(d["kind"] == "Job" and d["spec"]["template"]["spec"]["containers"][0]["command"] == ["sas", "migrate"]
               for d in example)
    from workers.app import sas as example_app
    longest = longest_steps(example_app.agents, example_app.workflows.values())
    assert longest["payment"] == 10.0  # the order example's charge_payment and its refund
    for agent, seconds in longest.items():
        pod = deployments[f"sas-agent-{agent}"]["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == int(seconds) + DRAIN_MARGIN
        container = pod["containers"][0]
        assert container["readinessProbe"]["exec"]["command"] == ["sas", "health", "--worker", f"{agent}@%h"]
        assert container["command"][container["command"].index("-n") + 1] == f"{agent}@%h"


def test_each_agent_has_a_scaled_object_on_its_outstanding_steps_per_worker_process():
    base = REPO / "deploy" / "kubernetes" / "base"
    deployments = {d["metadata"]["name"]: d for d in kustomized(base) if d["kind"] == "Deployment"}
    scaled = kustomized(base / "keda")
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled} == {n for n in deployments if "-agent-" in n}
    for s in scaled:
        command = deployments[s["spec"]["scaleTargetRef"]["name"]]["spec"]["template"]["spec"]["containers"][0][
            "command"]
        [trigger] = s["spec"]["triggers"]
        agent = s["metadata"]["name"].removeprefix("sas-agent-")
        assert trigger["metadata"]["query"] == f'max(sas_agent_outstanding{{agent="{agent}"}})'
        assert trigger["metadata"]["threshold"] == command[command.index("-c") + 1]
        # a series missing (Prometheus not scraping the dashboard) is an error, not zero steps
        assert trigger["metadata"]["ignoreNullValues"] == "false"


def test_sas_kubernetes_refuses_what_it_cannot_write_and_writes_nothing(sas_cli, tmp_path):
    CLI_APP.agent("payment")
    out = tmp_path / "out"
    for args, message in [(["--concurrency", "billing=2"], "--concurrency billing: no such agent; the app has payment"),
                          (["--concurrency", "payment=0"], "expected a number of processes >= 1"),
                          (["--env", "NOEQUALS"], "--env 'NOEQUALS': expected NAME=VALUE"),
                          (["--name", "Sas_1"], "--name 'Sas_1': lower-case letters")]:
        result = sas_cli("kubernetes", "--image", "x", "--out", str(out), *args, code=2)
        assert message in result.output
        assert not out.exists()


def test_agents_get_kubernetes_names_and_two_that_would_share_one_are_refused(sas_cli, tmp_path):
    """An agent may be named ``idle_Agent``; a Kubernetes object may not: its Deployment, container,
    budget and ScaledObject are named ``...-idle-agent``, and every object is valid. Two agents
    that would get the same name are refused, naming both, and nothing is written."""
    CLI_APP.agent("idle_Agent")
    out = tmp_path / "out"
    sas_cli("kubernetes", "--image", "x:1", "--out", str(out))
    objects = kustomized(out) + kustomized(out / "keda")
    for document in objects:
        if document["kind"] != "ScaledObject":
            kubernetes_validate.validate(document, KUBERNETES, strict=True)
    [deployment] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "sas-agent-idle-agent"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "agent-idle-agent"
    assert container["command"][container["command"].index("-Q") + 1] == "sas.agent.idle_Agent"
    [scaled] = [o for o in objects if o["kind"] == "ScaledObject"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "sas-agent-idle-agent"
    assert scaled["spec"]["triggers"][0]["metadata"]["query"] == 'max(sas_agent_outstanding{agent="idle_Agent"})'

    long_name = "shop-" + "x" * 40  # the migration Job's name would be 67 characters
    result = sas_cli("kubernetes", "--image", "x:1", "--out", str(tmp_path / "long"), "--name", long_name, code=2)
    assert f"the Job would be named '{long_name}-migrate-" in result.output and "shorten --name" in result.output
    assert not (tmp_path / "long").exists()

    CLI_APP.agent("idle-agent")
    again = tmp_path / "again"
    result = sas_cli("kubernetes", "--image", "x:1", "--out", str(again), "--env", "SAS_TEST_ONLY_HERE=1", code=2)
    assert "agents 'idle-agent' and 'idle_Agent' would both be named 'idle-agent'" in result.output
    assert not again.exists()
    assert "SAS_TEST_ONLY_HERE" not in os.environ  # --env is the loaded app's, not the caller's


def test_a_filled_in_secret_is_kept_and_no_secret_leaves_it_to_you(sas_cli, tmp_path):
    """Re-running ``sas kubernetes`` (after adding an agent, as the how-to says) never puts the
    placeholders back over passwords filled in; ``--no-secret`` writes no Secret and lists none,
    for a Secret made from the user's own secret store."""
    CLI_APP.agent("payment")
    out = tmp_path / "out"
    sas_cli("kubernetes", "--image", "x:1", "--out", str(out))
    secret = out / "secret.yaml"
    assert "CHANGE-ME" in secret.read_text()
    filled = secret.read_text().replace("CHANGE-ME", "s3cret")
    secret.write_text(filled)
    result = sas_cli("kubernetes", "--image", "x:2", "--out", str(out))
    assert secret.read_text() == filled
    assert f"{secret} kept as it was" in result.output and "does not match" not in result.output
    renamed = sas_cli("kubernetes", "--image", "x:2", "--out", str(out), "--name", "shop")
    assert secret.read_text() == filled  # kept, and the mismatch said
    assert "does not match the manifests: it names the Secret 'sas-secrets', the pods read shop-secrets" in \
        renamed.output
    [secret_object] = [o for o in kustomized(out) if o["kind"] == "Secret"]
    assert "s3cret" in secret_object["stringData"]["SAS_DATABASE_URL"]

    bare = tmp_path / "bare"
    sas_cli("kubernetes", "--image", "x:1", "--out", str(bare), "--no-secret")
    assert not (bare / "secret.yaml").exists()
    objects = kustomized(bare)
    assert not [o for o in objects if o["kind"] == "Secret"]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert {"secretRef": {"name": "sas-secrets"}} in deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"]


def test_a_new_image_gets_a_migration_job_of_its_own(sas_cli, tmp_path):
    """A Job's pod cannot be changed: applying a new image to a Job of the same name fails, and
    no migration runs. Each image and schema revision has its own Job; the same ones, the same."""
    CLI_APP.agent("payment")

    def job(image: str, out: Path) -> str:
        sas_cli("kubernetes", "--image", image, "--out", str(out))
        [found] = [o for o in kustomized(out) if o["kind"] == "Job"]
        kubernetes_validate.validate(found, KUBERNETES, strict=True)
        return found["metadata"]["name"]

    first = job("shop:1.4.2", tmp_path / "a")
    assert first.startswith("sas-migrate-")
    assert job("shop:1.4.2", tmp_path / "b") == first
    assert job("shop:1.4.3", tmp_path / "c") != first


@pytest.mark.integration  # the sas command, run as a user would
def test_a_step_timeout_given_with_env_sets_the_grace_period(tmp_path):
    """A timeout the app reads from its environment, given as ``--env`` (what the pods will be
    given), is the timeout the grace period and the drain are computed from."""
    (tmp_path / "shop.py").write_text(
        "import os\n"
        "from sas_app import SasApp, Step\n"
        "sas = SasApp()\n"
        "billing = sas.agent('billing')\n"
        "@billing.action\n"
        "def charge(call):\n"
        "    return {}\n"
        "timeout = float(os.environ.get('CHARGE_TIMEOUT', '60'))\n"
        "sas.workflow('order', steps=[Step('charge', charge, timeout=timeout)])\n")
    env = {**os.environ, "SAS_HOME": str(tmp_path / "home"),
           "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "sas_app.cli", "--app", "shop:sas", "kubernetes", "--image", "shop:1",
                           "--out", str(tmp_path / "k8s"), "--env", "CHARGE_TIMEOUT=300"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    [deployment] = [o for o in kustomized(tmp_path / "k8s") if o["metadata"]["name"] == "sas-agent-billing"
                    and o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 300 + DRAIN_MARGIN
    [config] = [o for o in kustomized(tmp_path / "k8s") if o["kind"] == "ConfigMap"]
    assert config["data"]["CHARGE_TIMEOUT"] == "300"


@pytest.mark.integration  # the sas command, run as a user would
@pytest.mark.parametrize("scheme", ["redis", "amqp"])
def test_sas_health_gives_up_on_a_broker_that_never_answers_within_its_timeout(tmp_path, scheme):
    """A broker that accepts connections and never answers (a hung server, a proxy whose backend
    is gone): readiness says so in one line and exits 1; liveness does not judge the worker for
    it and exits 0 — both within their ``--timeout``, never outlasting the kubelet's probe."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    SasApp(Settings(home=tmp_path / "home", broker_url="memory://localhost/", database_url=url)).migrate()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nothing ever answers
        env = {**os.environ, "SAS_HOME": str(tmp_path / "home"), "SAS_DATABASE_URL": url,
               "SAS_BROKER_URL": f"{scheme}://guest:guest@127.0.0.1:{silent.getsockname()[1]}/"}
        for args, code, said in [([], 1, "unhealthy: broker: "),
                                 (["--worker", "payment@pod", "--alive"], 0, "ok: the broker does not answer")]:
            if scheme == "redis" and not args:  # and a URL no connection can be made of: one line too
                bad = subprocess.run([sys.executable, "-m", "sas_app.cli", "health", "--alive", "--worker", "p@pod"],
                                     env={**env, "SAS_BROKER_URL": "redis://127.0.0.1:notaport/"},
                                     capture_output=True, text=True, timeout=30)
                assert (bad.returncode, bad.stderr) == (1, ""), bad.stderr
                assert bad.stdout.startswith("unhealthy: broker: ") and "check SAS_BROKER_URL" in bad.stdout
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "sas_app.cli", "health", "--timeout", "1", *args], env=env,
                                  capture_output=True, text=True, timeout=30)
            took = time.monotonic() - started
            assert done.returncode == code, done.stdout + done.stderr
            assert done.stdout.startswith(said), done.stdout
            assert took < 15, took  # the probe's timeoutSeconds is 20 (liveness 30)
