"""How the dashboard and the CLI show things to people: times, event details, state colours, what a step does."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from sas_app.definitions.steps import StepSpec
from sas_app.store import StepRow


def when(epoch: float | None) -> str:
    """An epoch time (the database's clock) as people read it: UTC, to the millisecond; ``-`` for none."""
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


STATE_COLOURS = {
    "pending": "#9aa5b1", "processing": "#3b82f6", "processed": "#16a34a", "error": "#dc2626",
    "compensating": "#f59e0b", "compensated": "#a16207", "cancelled": "#6b7280",
}


#: detail fields holding an epoch time (by the database's clock)
EPOCH_FIELDS = frozenset({"complete_by", "next_poll"})


def detail_text(detail: Any) -> str:
    """An event's detail for people: ``key: value`` pairs, epoch times as UTC times; an attempt's
    transient faults as how many, the first and the last."""
    if not detail:
        return ""
    if not isinstance(detail, dict):
        return str(detail)
    if detail.keys() == {"count", "first", "last"}:
        return faults_text(detail)
    parts = []
    for key, value in detail.items():
        if key in EPOCH_FIELDS and isinstance(value, (int, float)):
            value = when(value)
        parts.append(f"{key}: {value}")
    return ", ".join(parts)


def result_text(result: Any, width: int = 60) -> str:
    """A step's result as JSON, cut to ``width`` characters (``…`` where it is cut); empty for none."""
    if result is None:
        return ""
    text = json.dumps(result, default=str)
    return text if len(text) <= width else text[:width - 1] + "…"


def does(step: StepRow) -> str:
    """What a step does, in a few words: its agent action (and its polls), child run, sleep or wait."""
    if step.child:
        return f"child run of {step.child}"
    if step.is_wait:
        return f"waits for {step.event!r} ({step.on_timeout} after {step.timeout:g} s)"
    if step.is_sleep:
        return "sleeps"
    if step.poll:
        return f"{step.agent}.{step.action} (polls, {step.polls} so far, for at most {step.poll['max_wait']:g} s)"
    return f"{step.agent}.{step.action}"


def spec_does(spec: StepSpec) -> str:
    """What a step of a workflow's definition does, in a few words (:func:`does` for a run's step)."""
    if spec.child:
        return f"child run of {spec.child}"
    if spec.event:
        return f"waits for {spec.event!r}"
    if spec.sleep is not None or spec.sleep_until:
        return "sleeps"
    return (f"{spec.agent}.{spec.action_name}" + (f", for each of {spec.for_each}" if spec.for_each else "")
            + (", polls" if spec.poll else ""))


def after_text(waits_for: list[str], step: StepRow) -> str:
    """What a step waits for and its condition, if it has one: ``quote · unless quote.express``."""
    after = ", ".join(waits_for) or "-"
    return after if step.condition is None else f"{after} · {step.condition}"


def faults_text(faults: dict[str, Any]) -> str:
    """``3 transient faults: card gateway timeout; … the last: card gateway timeout``."""
    count, last = faults.get("count", 0), list(faults.get("last") or [])
    text = f"{count} transient fault{'s' if count != 1 else ''}: {faults.get('first')}"
    if last:
        skipped = count - 1 - len(last)
        text += f"; {'… ' if skipped > 0 else ''}then: {'; '.join(last)}"
    return text
