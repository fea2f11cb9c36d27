"""What a chaos run found, told: the percentiles it reports, how long each given-up attempt took
to be dispatched again, why runs did not end processed, and the printed report."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from bench.alert_quality import MARGIN_S
from bench.throughput import percentile as nearest_rank


def percentile(values: list[float], p: float) -> float | None:
    """The throughput bench's percentile, to the millisecond; None for no values."""
    return round(nearest_rank(values, p), 3) if values else None


def reason(error: str) -> str:
    """An error message without the ids in it, so that equal reasons count together."""
    if "lost its worker" in error:
        return "a step lost its worker every attempt (poison)"
    if "refused" in error:
        return "a remote service refused a step for good"
    if "complete-by" in error:
        return "a step passed its complete-by at every attempt"
    return error[:120]


def recovery_times(event_rows: list[Any]) -> tuple[list[float], dict[str, dict[str, Any]]]:
    """From each attempt given up to its step's next dispatch, in seconds: measured from the
    attempt's complete-by for one the Supervisor found expired, from the worker's report for one
    whose worker died."""
    deadline: dict[tuple[str, int, int], float] = {}
    given_up: dict[tuple[str, int, int], tuple[float, str]] = {}
    times: dict[str, list[float]] = defaultdict(list)
    for e in event_rows:
        if e.kind != "transition" or e.position is None:
            continue
        key = (e.run_id, e.position, e.attempt)
        if e.to_state == "running" and e.detail:
            deadline[key] = e.detail.get("complete_by")
            previous = given_up.pop((e.run_id, e.position, e.attempt - 1), None)
            if previous is not None:
                times[previous[1]].append(e.at - previous[0])
        elif e.from_state == "running" and e.to_state == "pending" and e.detail and "reason" in e.detail:
            cause = e.detail["reason"]
            start = deadline.get(key) if cause == "expired" else e.at
            if start is not None:
                given_up[key] = (start, cause)
    everything = [t for values in times.values() for t in values]
    summary = {cause: {"count": len(v), "p50": percentile(v, 50), "max": round(max(v), 3)}
               for cause, v in times.items()}
    return everything, summary


def print_report(r: dict[str, Any]) -> None:
    rec, lat = r["recovery_s"], r["latency_s"]
    lines = [
        f"bench.chaos, seed {r['seed']}: {r['submitted']} orders, {r['elapsed_s']}s",
        "faults injected: " + ", ".join(f"{k} {v}" for k, v in r["faults_injected"].items()),
        f"submitted {r['submitted']}  processed {r['processed']}  compensated {r['compensated']}  "
        f"error {r['error']}  (client retries while servers were down: {r['submit_retries']})",
        *(f"  not processed: {n} x {why}" for why, n in r["not_processed_reasons"].items()),
        f"lost {r['lost']}  effects applied twice {r['effects_applied_twice']}  effects left standing "
        f"{r['effects_left_standing']}  not terminal within {r['bound_s']:.0f}s {r['not_terminal_within_bound']}  "
        f"passwords in logs {r['secrets_in_logs']}  step attempts moved out of running twice "
        f"{len(r['attempts_moved_twice'])}",
        f"recovery to re-dispatch over {rec['count']} attempts given up: p50 {rec['p50']}s  p99 {rec['p99']}s  "
        f"max {rec['max']}s",
        "attempts per step: " + ", ".join(f"{k}: {v}" for k, v in r["attempts_per_step"].items()),
        f"end-to-end latency: p50 {lat['p50']}s  p99 {lat['p99']}s (orders not held, processed: p50 "
        f"{lat['orders_processed_p50']}s  p99 {lat['orders_processed_p99']}s)",
        f"held orders (a manager's review, then a cooling-off sleep): {r['held_orders']['held']}, "
        f"{r['held_orders']['never_signalled']} never reviewed, {r['held_orders']['sent_twice']} reviewed twice; "
        + ", ".join(f"{k} {v}" for k, v in r["held_orders"]["outcomes"].items())
        + f"; broken promises {len(r['held_orders']['wrong'])}",
        "at-risk alerts: {alerts} (told as {notifications}), right {alerts_whose_step_missed} (precision {precision}), "
        "incidents {incidents} with a step that missed {incidents_with_a_miss} (precision {incident_precision}); "
        "missed waiting in a "
        "queue {missed_waiting_in_queue}, foreseen {missed_after_an_alert} (recall {recall}), in {backlogs} "
        "backlogs, {backlogs_told} told (recall {backlog_recall}); missed other ways "
        "{missed_other_ways} ({missed_out_of_line} out of line: taken by a worker that went away before it said so); "
        "at the margin (received within {margin} s of the complete-by): {wrong_within_margin} "
        "of the wrong, {unforeseen_within_margin} of the unforeseen".format(**r["at_risk"], margin=MARGIN_S),
        "poison orders: " + ", ".join(f"{p['key']} {p['state']} after {p['charge_attempts']} attempts"
                                      for p in r["poison"]),
        "operators' orders: " + (", ".join(f"{n} x {what}" for what, n in r["operators"]["outcomes"].items())
                                 or "none") + f" ({r['operators']['submitted']} submitted for them; "
        f"{r['operators']['paused_asked_again']} paused asked about again after their resume was lost); "
        f"live runs with nothing due: {r['stranded_runs']}",
        f"notifications (orders that asked to be told): {r['notifications']}, left in the outbox {r['outbox_unsent']}",
        *([soak_line(r["soak"])] if "soak" in r else []),
        "invariants: " + ("hold" if r["invariants_hold"] else "BROKEN"),
    ]
    print("\n".join(lines), flush=True)


def soak_line(soak: dict[str, Any]) -> str:
    if soak.get("memory_flat") is None:
        return f"soak: {soak.get('why', 'nothing to judge')}"
    worst = next(iter(soak["memory_growth"].items()), ("-", 0.0))
    return (f"soak, first and last {soak['window_s']:.0f}s: memory of {soak['processes_judged']} processes "
            f"{'flat' if soak['memory_flat'] else 'GROWN: ' + ', '.join(soak['memory_grown'])} (most: {worst[0]} "
            f"{worst[1]:+.1%}); database connections {soak['connections_first_max']} -> "
            f"{soak['connections_last_max']} ({'flat' if soak['connections_flat'] else 'GROWN'}); the harness "
            + ", ".join(f"{key} {g:+.1%}" for key, g in soak["harness_growth"].items()))
