"""Submitting many runs at once: :meth:`SasApp.submit_many`.

Every item is checked as :meth:`Client.submit` checks one. Those that pass are written in one
transaction, in a few statements for the whole batch rather than a round trip per run: their runs
(deduplicated on workflow and business key, within the batch and against the store), steps, first
events and notifications. Each new run is then started by the Scheduler's message. An item refused
— bad input, an unknown workflow, a business key that already names a run with another payload —
is reported in its place and writes nothing; a store that fails writes nothing at all, and the
same batch may simply be submitted again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import DBAPIError

from sas_app import fault_points, tracing
from sas_app.errors import DuplicateBusinessKey, InvalidSubmission, SasError
from sas_app.interfaces.client import Client, RunHandle, schema_not_ready
from sas_app.messaging.publishes import Publish
from sas_app.messaging.routing import asking

if TYPE_CHECKING:
    from sas_app.definitions.workflow import Workflow
    from sas_app.store import NewRun


#: runs per message to the Scheduler after a bulk submit: few enough that the Scheduler's
#: processes share a batch's runs out, many enough to spare a message per run
ADVANCE_CHUNK = 100

@dataclass(frozen=True)
class Submission:
    """One run to submit: what :meth:`SasApp.submit` takes."""

    workflow: Workflow | str
    payload: Any
    business_key: str
    reply_to: str | None = None
    priority: int = 5


@dataclass(frozen=True)
class Submitted:
    """What became of the item at ``index``: its run's handle (``handle.created`` False when the
    business key already named that run), or the error that kept it out."""

    index: int
    handle: RunHandle | None = None
    error: SasError | None = None

    @property
    def ok(self) -> bool:
        return self.handle is not None


def submit_many(client: Client, items: Iterable[Submission | Mapping[str, Any]]) -> list[Submitted]:
    """Submit ``items`` (each a :class:`Submission` or a mapping of its fields) in one transaction;
    one :class:`Submitted` per item, in their order."""
    outcomes: dict[int, Submitted] = {}
    first: dict[tuple[str, str], tuple[int, Workflow, NewRun]] = {}  # the item that writes each key
    repeats: list[tuple[int, tuple[str, str]]] = []  # later items with the same key and payload
    for index, raw in enumerate(items):
        try:
            item = raw if isinstance(raw, Submission) else Submission(**raw)
        except TypeError as exc:
            outcomes[index] = Submitted(index, error=InvalidSubmission(f"item {index}: {exc}"))
            continue
        try:
            wf, payload = client.checked(item.workflow, item.payload, item.business_key, item.reply_to, item.priority)
        except SasError as exc:
            outcomes[index] = Submitted(index, error=exc)
            continue
        key = (wf.name, item.business_key)
        if key in first:
            if first[key][2].payload == payload:
                repeats.append((index, key))
            else:
                outcomes[index] = Submitted(index, error=DuplicateBusinessKey(
                    f"business key {item.business_key!r} names item {first[key][0]} of this batch, "
                    f"with a different payload"))
            continue
        new = wf.new_run(uuid.uuid4().hex, item.business_key, payload, reply_to=item.reply_to,
                         priority=item.priority)
        first[key] = (index, wf, new)
    created: list[str] = []
    if first:
        with tracing.span("sas.submit_many", runs=len(first)):
            created = _write(client, first, outcomes)
        fault_points.hit("submit.after_commit")
    for index, key in repeats:  # as the item it repeats: its run (not created by this item), or its error
        written = outcomes[first[key][0]]
        outcomes[index] = Submitted(index, error=written.error) if written.handle is None else \
            Submitted(index, RunHandle(client, written.handle.id, created=False))
    # the Scheduler is asked about the new runs in a message per ADVANCE_CHUNK, not one per run
    for start in range(0, len(created), ADVANCE_CHUNK):
        client.router.send(asking(created[start:start + ADVANCE_CHUNK], Publish.SUBMITTED))
    return [outcomes[i] for i in sorted(outcomes)]


def _write(client: Client, first: dict[tuple[str, str], tuple[int, Workflow, NewRun]],
           outcomes: dict[int, Submitted]) -> list[str]:
    """Write the batch's runs; record each item's outcome; the ids of the runs created.

    Items of workflows without ``on_submit`` go in together. A workflow's ``on_submit`` runs for
    each of its items in a savepoint of its own, so that an item it refuses (with a
    :class:`SasError`, such as :class:`InvalidSubmission`) is reported in its place; any other
    exception it raises aborts the whole batch."""
    pickup = client.settings.pickup_timeout
    try:
        with client.store.begin() as tx:
            plain = [new for _, wf, new in first.values() if wf.on_submit is None]
            written = tx.submission.insert_runs(plain, pickup)
            for key, (index, wf, new) in first.items():
                if wf.on_submit is None:
                    continue
                try:
                    with tx.savepoint():
                        written[key] = run, created = tx.submission.insert_run(new, pickup)
                        if created:
                            wf.on_submit(tx.conn, run)
                except SasError as exc:
                    written.pop(key, None)
                    outcomes[index] = Submitted(index, error=exc)
    except DBAPIError:
        schema_not_ready(client.store)
        raise
    client.router.relay(tx.outbox)
    created_ids = []
    for key, (index, wf, new) in first.items():
        if key not in written:
            continue
        run, created = written[key]
        if created:
            created_ids.append(run.id)
            outcomes[index] = Submitted(index, RunHandle(client, run.id, created=True))
        elif run.payload == new.payload:
            outcomes[index] = Submitted(index, RunHandle(client, run.id, created=False))
        else:
            outcomes[index] = Submitted(index, error=DuplicateBusinessKey(
                f"business key {new.business_key!r} already names run {run.id} of workflow "
                f"{wf.name!r} with a different payload"))
    return created_ids
