"""The audit trail: every action taken through the dashboard, the API and the CLI, with who took
it, on which run, why, and whether it was done or refused (and the refusal's words).

Each door wraps what it does in :meth:`AuditTrail.acting`; a bulk action writes one row per run
under one ``batch`` id. The row is appended once the outcome is known, in a transaction of its
own: an action whose process dies between its own commit and that row is missing from the trail,
though an operator's action and a signal are in the run's history too, with who took them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sas_app.errors import SasError, one_line
from sas_app.interfaces.access import Actor
from sas_app.messaging.routing import SUBMIT
from sas_app.states import Role
from sas_app.store import Store

log = logging.getLogger(__name__)

#: the outcomes an audit row records
OUTCOMES = ("done", "refused", "failed")


@dataclass
class Entry:
    """What an action about to be taken writes in the trail; ``run_id`` and ``target`` may be
    filled in once known (a submission's new run)."""

    actor: Actor
    action: str
    run_id: str | None = None
    target: str | None = None
    reason: str = ""
    batch: str | None = None


def new_batch() -> str:
    """An id grouping the rows of one bulk action."""
    return uuid.uuid4().hex


class AuditTrail:
    def __init__(self, store: Store) -> None:
        self.store = store

    @contextmanager
    def acting(self, actor: Actor, action: str, *, run_id: str | None = None, target: str | None = None,
               reason: str = "", batch: str | None = None, only_refusal: bool = False) -> Iterator[Entry]:
        """Within: the action. Its row says ``done`` when the block ends (unless ``only_refusal``:
        the block only checks what the action may do, and the rows of what it did come after),
        ``refused`` (with the error's words) when it raises a :class:`SasError`, ``failed`` on
        anything else; the error goes on up."""
        entry = Entry(actor, action, run_id, target, reason, batch)
        try:
            yield entry
        except SasError as exc:
            self.record(entry, "refused", str(exc))
            raise
        except Exception as exc:
            self.record(entry, "failed", one_line(exc))
            raise
        if not only_refusal:
            self.record(entry, "done")

    def broker_refusal(self, task: str, kwargs: Mapping[str, Any], key_id: str, reason: str) -> None:
        """A ``sas.submit`` or ``sas.signal`` the broker's trust refused (:class:`~sas_app.messaging.signing.Gate`)."""
        def text(name: str) -> str:
            value = kwargs.get(name)
            return value if isinstance(value, str) else ""

        # who sent it is not known: the key it claims is only a claim
        actor = Actor("unverified" if key_id else "unsigned", Role.VIEWER, "broker",
                      f"the broker, claiming key {key_id}" if key_id else "the broker")
        action = "submit" if task == SUBMIT else "signal"
        run_id = text("run_id")
        target = ":".join(filter(None, (text("workflow"), text("business_key"), text("event")))) or None
        self.record(Entry(actor, action, run_id if len(run_id) == 32 else None, target), "refused", reason)

    def record(self, entry: Entry, outcome: str, refusal: str | None = None) -> None:
        self.record_many([(entry, outcome, refusal)])

    def record_many(self, outcomes: Sequence[tuple[Entry, str, str | None]]) -> None:
        """Append each ``(entry, outcome, refusal)``, in one transaction."""
        rows = [{"actor": e.actor.name[:200], "role": e.actor.role.value, "via": e.actor.via,
                 "origin": e.actor.origin[:200], "action": e.action, "run_id": e.run_id,
                 "target": e.target[:300] if e.target else None, "reason": e.reason, "outcome": outcome,
                 "refusal": refusal, "batch": e.batch} for e, outcome, refusal in outcomes]
        try:
            self.store.append_audit(rows)
        except Exception as exc:  # the action's own outcome stands (a store that is down says so itself)
            log.error("could not append to the audit trail (%s): %s", one_line(exc), rows)
