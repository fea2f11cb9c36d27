"""docker-compose.yml: every command names a real entry point, secrets come from the environment.

Docker does not run on the CI machine, so the file is checked against the code it names."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import yaml

from sas_app.cli.main import main as sas_cli
from workers.app import sas

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_every_command_resolves_to_a_real_entry_point(services):
    commands = {name: svc["command"] for name, svc in services.items() if "command" in svc and name not in
                ("redis", "postgres")}
    assert set(commands) >= {"migrate", "scheduler", "agent-payment", "agent-fraud", "agent-warehouse", "agent-orders",
                             "beat", "payment-service", "warehouse-service", "flower", "dashboard"}
    consumed: set[str] = set()
    for name, argv in commands.items():
        assert argv[0] == "sas", f"{name}: {argv}"
        sub = sas_cli.commands.get(argv[1])
        assert isinstance(sub, click.Command), f"{name}: no `sas {argv[1]}`"
        ctx = sub.make_context(f"sas {argv[1]}", list(argv[2:]), resilient_parsing=False)
        if argv[1] == "worker":
            queues = ctx.params["queues"].split(",")
            assert set(queues) <= set(sas.queues()), f"{name}: unknown queue in {queues}"
            consumed |= set(queues)
    from flower.command import flower  # noqa: F401 - `sas flower` runs Flower, a regular dependency
    assert consumed == set(sas.queues()), "every queue has a worker"


def test_each_worker_is_checked_by_sas_health_naming_its_own_node(services):
    workers = {name: svc for name, svc in services.items() if svc.get("command", [None, None])[1] == "worker"}
    assert len(workers) == 5
    for name, svc in workers.items():
        argv = svc["command"]
        node = argv[argv.index("-n") + 1]
        assert svc["healthcheck"]["test"] == ["CMD", "sas", "health", "--worker", node], name


def test_no_credentials_are_committed_and_flower_asks_for_them(services):
    text = COMPOSE.read_text()
    for secret in ("REDIS_PASSWORD", "POSTGRES_PASSWORD", "FLOWER_USER", "FLOWER_PASSWORD"):
        assert f"${{{secret}:?" in text, f"{secret} must come from the environment"
    compose = yaml.safe_load(text)
    for svc in compose["services"].values():
        for key, value in (svc.get("environment") or {}).items():
            if "PASSWORD" in key:
                assert str(value).startswith("${"), f"{key} is a literal"
            for secret in re.findall(r"://[^:/@]*:([^@]+)@", str(value)):
                assert secret.startswith("${"), f"{key} carries a literal password"
    assert any("--basic-auth=" in part for part in services["flower"]["command"])
    assert [p for p in services["dashboard"]["command"] if p.startswith("--basic-auth=")] == \
        [p for p in services["flower"]["command"] if p.startswith("--basic-auth=")], "the dashboard asks as Flower does"
    assert services["migrate"]["restart"] == "no"


class ComposeLoader(yaml.SafeLoader):
    """Compose's merge tags (``!override``, ``!reset``) read as the value they carry."""


ComposeLoader.add_constructor("!override", lambda loader, node: loader.construct_mapping(node, deep=True))
ComposeLoader.add_constructor("!reset", lambda loader, node: None)


def test_the_rabbitmq_variant_runs_every_process_on_rabbitmq_and_no_redis(services):
    text = (COMPOSE.parent / "docker-compose.rabbitmq.yml").read_text()
    override = yaml.load(text, Loader=ComposeLoader)["services"]
    assert override["redis"]["profiles"], "Redis is not started"
    assert "${RABBITMQ_PASSWORD:?" in override["rabbitmq"]["environment"]["RABBITMQ_DEFAULT_PASS"]
    base = {name for name, svc in services.items() if "SAS_BROKER_URL" in (svc.get("environment") or {})}
    assert base and base <= set(override), "every process that has the broker's URL gets RabbitMQ's"
    for name in base:
        assert override[name]["environment"]["SAS_BROKER_URL"].startswith("amqp://sas:${RABBITMQ_PASSWORD:?"), name
        needs = set(services[name].get("depends_on") or {})
        if "redis" in needs:  # waits for RabbitMQ instead, and for nothing of Redis
            assert set(override[name]["depends_on"]) == needs - {"redis"} | {"rabbitmq"}, name
