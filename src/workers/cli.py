"""The order example's commands, added to ``sas`` through the ``sas_app.commands`` entry point group
(pyproject.toml): ``sas demo`` and the two simulated remote services it runs."""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import click


def fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


@click.command()
@click.option("--orders", type=click.IntRange(1, 100_000), default=50, show_default=True,
              help="How many orders to submit.")
@click.option("--fault-rate", type=click.FloatRange(0, 1), default=0.2, show_default=True,
              help="Share of orders given a fault (transient error, hang past complete-by, latency).")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed for the fault plan.")
@click.option("--timeout", type=float, default=300, show_default=True, help="Give up after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def demo(orders: int, fault_rate: float, seed: int, timeout: float, as_json: bool) -> None:
    """Run the order example live: worker, beat and payment-service processes, faults injected,
    one agent worker crash; ends with a summary (lost and duplicate charges must be 0)."""
    from .demo import ProcessGone, print_summary, run_demo

    try:
        summary = run_demo(orders, fault_rate, seed, timeout, as_json)
    except KeyboardInterrupt:
        fail("interrupted; every process the demo started has been stopped")
    except ProcessGone as exc:
        fail(f"{exc}\nevery other process the demo started has been stopped")
    if as_json:
        click.echo(json.dumps(summary))
    else:
        print_summary(summary)
    if summary["lost"] or summary["duplicate_charges"] or summary["charges_not_undone"]:
        sys.exit(1)


def _service_command(name: str, port: int, what: str) -> click.Command:
    @click.command(f"{name}-service", help=f"Start the simulated remote {what} of the order example.")
    @click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
    @click.option("--port", type=int, default=port, show_default=True)
    @click.option("--ledger", default=None, help="The service's ledger file (default under SAS_HOME).")
    @click.option("--seed", type=int, default=None, help="Seed for the fault rates below.")
    @click.option("--transient-rate", type=float, default=0.0, help="Share of requests answered 503 once.")
    @click.option("--hang-rate", type=float, default=0.0, help="Share of first attempts that hang 30 s.")
    @click.option("--permanent-rate", type=float, default=0.0, help="Share of requests refused for good.")
    @click.option("--latency-rate", type=float, default=0.0, help="Share of requests delayed 0.2 s.")
    @click.option("--crash-rate", type=float, default=0.0, help="Share of requests that crash the service.")
    @click.option("--down-rate", type=float, default=0.0, help="Share of requests answered 503 every time "
                  "(1: the service is down for everyone).")
    def command(host: str, port: int, ledger: str | None, seed: int | None, **rates: float) -> None:
        from . import remote_service

        argv = ["--name", name, "--host", host, "--port", str(port)]
        if ledger:
            argv += ["--ledger", ledger]
        if seed is not None:
            argv += ["--seed", str(seed)]
        for option, rate in rates.items():
            argv += ["--" + option.replace("_", "-"), str(rate)]
        remote_service.main(argv)

    return command


payment_service = _service_command("payment", 8765, "payment service (charge, refund)")
warehouse_service = _service_command(
    "warehouse", 8766, "warehouse (reserve and release stock, ship and cancel shipments)")
