"""Starting a new run and completing a step and starting what follows it: what the submitting
process does for a new run, :meth:`HotPathTx.start_new_run`, and the one method the Scheduler
calls for an agent's success reply, :meth:`HotPathTx.complete_and_advance`.

On PostgreSQL the common case is one statement (a data-modifying CTE: lock the run, complete the
step fenced on its attempt, mark the next workflow step running if it is due — or, after the last
step, mark the run processed and announce it — and write the events). Everything else (a stale
reply, a paused or compensating run, an undo, a run whose steps are not a straight line), and
every reply on SQLite, takes the same transitions one statement at a time; for a run that is not
a straight line only the step completes here, and the Scheduler decides what its graph starts.
``tests/integration/test_store_parity.py`` runs the same sequences on both and compares every
row and event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Integer, String, bindparam, column, select, text
from sqlalchemy.dialects.postgresql import JSONB

from sas_app.messaging.routing import Notification
from sas_app.states import LIVE_RUN_STATES, EventKind, RunState, StepState
from sas_app.store.compensation import CompensationTx
from sas_app.store.connection import PG_NOW
from sas_app.store.graph_path import COMPLETE_IN_GRAPH
from sas_app.store.prepared import PREPARED, rows
from sas_app.store.rows import RunRow, StepRow, field_names, prefixed, prefixed_columns
from sas_app.store.runs import RunTx
from sas_app.store.steps import StepTx
from sas_app.store.tables import runs, steps
from sas_app.store.transitions import RUN_DONE_CHANNEL, Part, TxBase

_RUN_COLUMNS = field_names(RunRow)
_STEP_COLUMNS = field_names(StepRow)
_RUNNING, _COMPLETED = StepState.RUNNING.value, StepState.COMPLETED.value
_PROCESSING, _PROCESSED = RunState.PROCESSING.value, RunState.PROCESSED.value
_TRANSITION = EventKind.TRANSITION.value


def _next_due(s: str) -> str:
    """The step (``s``) at the run's next position, if the statement can start it now."""
    return f"""{s}.run_id = :b_run_id AND {s}.position = :b_position + 1 AND {s}.compensates IS NULL
      AND {s}.state IN ('{StepState.NOT_STARTED}', '{StepState.PENDING}')
      AND ({s}.not_before IS NULL OR {s}.not_before <= {PG_NOW})"""


# The run has no workflow step after the one completed.
_NONE_LATER = """NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = :b_run_id AND s.position > :b_position
                               AND s.compensates IS NULL)"""


# What makes the completion whole in itself, for COMPLETE_ALONE: nothing left for the planner —
# the next step starts now, or there is none — and nothing to read once it has committed (a run
# with a concurrency key ends in a transaction, which finds the next run waiting for its key).
_WHOLE = f"""
      AND (EXISTS (SELECT 1 FROM steps n WHERE {_next_due("n")})
           OR (run.slot IS NULL AND {_NONE_LATER}))"""
# The two halves of _WHOLE, each for a run with no reply queue (nothing to notify): the next step
# starts now (COMPLETE_NEXT), or there is none and the run ends (COMPLETE_LAST).
_QUIET_NEXT = f"""
      AND run.reply_to IS NULL AND EXISTS (SELECT 1 FROM steps n WHERE {_next_due("n")})"""
_QUIET_LAST = f"""
      AND run.reply_to IS NULL AND run.slot IS NULL AND {_NONE_LATER}"""


def _complete_and_advance(whole: str, *, advance: bool = True, finish: bool = True, notes: bool = True) -> str:
    """The statement's text; ``whole`` narrows the step it completes. A narrower form leaves out
    what ``whole`` rules out: starting the next step (``advance``), ending the run (``finish``),
    the notifications of a run with a reply queue (``notes``)."""
    nxt = f"""
), nxt AS (
    UPDATE steps SET state = '{_RUNNING}', attempt = steps.attempt + 1, locked_by = :b_locked_by,
                     complete_by = {PG_NOW} + steps.timeout, not_before = NULL, updated_at = {PG_NOW}
    WHERE {_next_due("steps")}
      AND EXISTS (SELECT 1 FROM done)
    RETURNING steps.*"""
    # without ``advance`` the step completed is the last (``whole`` said so): nothing to look for
    fin = f"""
), fin AS (
    UPDATE runs SET process_state = '{_PROCESSED}', locked_by = NULL, complete_by = NULL, updated_at = {PG_NOW}
    WHERE runs.id = :b_run_id AND EXISTS (SELECT 1 FROM done){f" AND {_NONE_LATER}" if advance else ""}
    RETURNING runs.id"""
    started = f"""
    UNION ALL
    SELECT :b_run_id, n.position, '{_TRANSITION}',
           CASE WHEN n.attempt = 1 THEN '{StepState.NOT_STARTED}' ELSE '{StepState.PENDING}' END,
           '{_RUNNING}', n.attempt, :b_locked_by, {PG_NOW}, jsonb_build_object('complete_by', n.complete_by)
    FROM nxt n"""
    ended = f"""
    UNION ALL
    SELECT :b_run_id, NULL, '{_TRANSITION}', '{_PROCESSING}', '{_PROCESSED}', NULL, :b_locked_by, {PG_NOW}, NULL
    FROM fin"""
    processed_note = f"""
        UNION ALL
        SELECT 2, jsonb_build_object('run_id', :b_run_id, 'business_key', r.business_key, 'workflow', r.workflow,
                                     'kind', '{_PROCESSED}', 'state', '{_PROCESSED}')
        FROM fin, run r"""
    note = f"""
), note AS (
    INSERT INTO outbox (run_id, reply_to, body, created_at)
    SELECT :b_run_id, r.reply_to, b.body, {PG_NOW}
    FROM run r, (
        SELECT 1 AS o, jsonb_build_object('run_id', :b_run_id, 'business_key', r.business_key,
                                          'workflow', r.workflow, 'kind', 'step_completed', 'step', d.name,
                                          'position', d.position, 'attempt', d.attempt) AS body
        FROM done d, run r{processed_note if finish else ""}
    ) b
    WHERE r.reply_to IS NOT NULL
    ORDER BY b.o
    RETURNING outbox.id, outbox.body"""
    announce = f"""
), announce AS (
    SELECT pg_notify('{RUN_DONE_CHANNEL}', id) FROM fin"""
    return f"""
WITH run AS (
    SELECT * FROM runs WHERE id = :b_run_id FOR UPDATE
), done AS (
    UPDATE steps SET state = '{_COMPLETED}', result = :b_result, locked_by = NULL,
                     completed_at = {PG_NOW}, updated_at = {PG_NOW}
    FROM run
    WHERE steps.run_id = :b_run_id AND run.process_state = '{_PROCESSING}' AND run.paused_by IS NULL AND run.linear
      AND steps.position = :b_position AND steps.state = '{_RUNNING}' AND steps.attempt = :b_attempt
      AND steps.compensates IS NULL{whole}
    RETURNING steps.position, steps.attempt, steps.name{nxt if advance else ""}{fin if finish else ""}
), ev AS (
    INSERT INTO events (run_id, position, kind, from_state, to_state, attempt, actor, at, detail)
    SELECT :b_run_id, d.position, '{_TRANSITION}', '{_RUNNING}', '{_COMPLETED}', d.attempt, :b_locked_by,
           {PG_NOW}, NULL::jsonb
    FROM done d{started if advance else ""}{ended if finish else ""}{note if notes else ""}{announce if finish else ""}
)
SELECT (SELECT name FROM done) AS done_name,
       {"(SELECT count(*) FROM announce)" if finish else "0"} AS finished,
       {"(SELECT jsonb_agg(jsonb_build_object('id', id, 'body', body) ORDER BY id) FROM note)" if notes
        else "NULL::jsonb"} AS notes,
       {", ".join(f"r.{c} AS r_{c}" for c in _RUN_COLUMNS)}{"".join(f", n.{c} AS n_{c}" for c in _STEP_COLUMNS)
                                                             if advance else ""}
FROM run r{" LEFT JOIN nxt n ON true" if advance else ""}
"""


def _statement(whole: str, *, advance: bool = True, finish: bool = True, notes: bool = True) -> Any:
    """The prepared statement of :func:`_complete_and_advance`, with the columns its form answers."""
    sql = _complete_and_advance(whole, advance=advance, finish=finish, notes=notes)
    return text(sql).bindparams(bindparam("b_result", type_=JSONB)).columns(
        column("done_name", String()), column("finished", Integer()), column("notes", JSONB()),
        *prefixed_columns(runs, "r_", _RUN_COLUMNS), *(prefixed_columns(steps, "n_", _STEP_COLUMNS) if advance else ()),
    ).execution_options(**PREPARED)


# Every sub-statement sees one snapshot and each update is fenced, so these are the same
# transitions as the step-by-step path below, in one round trip. Every sub-statement finds its
# steps by the bound run id, never through the join with ``run``: a prepared statement keeps the
# plan it got on a young, small table, where the join was planned as a scan of all of steps.
COMPLETE_AND_ADVANCE = _statement("")
#: COMPLETE_AND_ADVANCE for a statement that is its own transaction: it completes the step only
#: when that completion needs nothing more written (see ``_WHOLE``), and otherwise changes nothing
COMPLETE_ALONE = _statement(_WHOLE)
#: COMPLETE_ALONE where the run has no reply queue and the next step starts now; otherwise it
#: changes nothing. PostgreSQL starts every part of a statement it runs, whether it writes a row or
#: not: a part that cannot write (the outbox's insert, the run's ending) is work it is spared.
COMPLETE_NEXT = _statement(_QUIET_NEXT, finish=False, notes=False)
#: COMPLETE_ALONE where the run has no reply queue and no step after this one; otherwise it
#: changes nothing
COMPLETE_LAST = _statement(_QUIET_LAST, advance=False, notes=False)


# A new run claimed (pending → processing, locked) and, on a straight line, its first step
# marked running: CLAIM_RUN and MARK_NEXT_RUNNING at position 0, in one round trip.
START_NEW_RUN = text(f"""
WITH new_run AS (
    UPDATE runs SET process_state = '{_PROCESSING}', locked_by = :b_locked_by, complete_by = NULL,
                    updated_at = {PG_NOW}
    WHERE id = :b_run_id AND COALESCE(process_state, '') = '{RunState.PENDING}' AND slot IS NULL
    RETURNING runs.*
), first AS (
    UPDATE steps SET state = '{_RUNNING}', attempt = steps.attempt + 1, locked_by = :b_locked_by,
                     complete_by = {PG_NOW} + steps.timeout, not_before = NULL, updated_at = {PG_NOW}
    FROM new_run run
    WHERE steps.run_id = :b_run_id AND steps.position = 0 AND steps.compensates IS NULL
      AND run.paused_by IS NULL AND run.linear
      AND steps.state IN ('{StepState.NOT_STARTED}', '{StepState.PENDING}')
      AND (steps.not_before IS NULL OR steps.not_before <= {PG_NOW})
    RETURNING steps.*
)
SELECT {", ".join(f"r.{c} AS r_{c}" for c in _RUN_COLUMNS)},
       {", ".join(f"n.{c} AS n_{c}" for c in _STEP_COLUMNS)}
FROM new_run r LEFT JOIN first n ON true
""").columns(
    *prefixed_columns(runs, "r_", _RUN_COLUMNS), *prefixed_columns(steps, "n_", _STEP_COLUMNS),
).execution_options(**PREPARED)


@dataclass(frozen=True)
class Completion:
    """What an agent's success reply did."""

    #: the run as it was when locked (None: no such run)
    run: RunRow | None
    #: the name of the step completed; None when the reply was stale (nothing changed)
    step: str | None = None
    #: the steps this completion started (now running, to dispatch)
    started: list[StepRow] = field(default_factory=list)
    #: the run is now processed
    finished: bool = False
    #: something may still be due that only the Scheduler's planner can start
    plan: bool = False
    #: the results the started steps' agents are told (None: the caller works them out)
    results: dict[str, Any] | None = None


class HotPathTx(Part):
    def __init__(self, tx: TxBase, runs: RunTx, steps: StepTx, compensation: CompensationTx) -> None:
        super().__init__(tx)
        self.runs = runs
        self.steps = steps
        self.compensation = compensation

    def start_new_run(self, run_id: str, locked_by: str) -> tuple[RunRow | None, StepRow | None]:
        """Claim ``run_id`` if it is pending with no concurrency key (None, None otherwise) and,
        if it is a straight line and not paused, mark its first step running: the run (locked)
        and that step, with their events and notifications."""
        if not self.tx.is_postgresql:
            run = self.runs.claim_pending_run(run_id, locked_by)
            first = None
            if run is not None and not run.paused_by and run.linear:
                first = self.steps.mark_next_running(run_id, 0, locked_by)
            return run, first
        found = rows(self.conn, START_NEW_RUN, {"b_run_id": run_id, "b_locked_by": locked_by})
        if not found:
            return None, None
        mapping = found[0]
        run = self.runs.claimed(prefixed(RunRow, mapping, "r_"), locked_by)
        first = None if mapping["n_id"] is None else self.steps.dispatched(prefixed(StepRow, mapping, "n_"),
                                                                           locked_by)
        return run, first

    def complete_and_advance(self, run_id: str, position: int, attempt: int, result: Any,
                             locked_by: str) -> Completion:
        """Complete the step at ``position`` if ``attempt`` still runs there and the run is live,
        and start what follows it on the hot path: on a straight line the next step if it is due,
        or the run's ``processed`` after its last step; in a graph, on PostgreSQL, what
        :data:`~sas_app.store.graph_path.COMPLETE_IN_GRAPH` starts. Anything else that follows (a
        back-off not over, a paused run, the next undo, a fan-out) is the planner's to find."""
        run = None
        if self.tx.is_postgresql:
            found = rows(self.conn, COMPLETE_AND_ADVANCE, {
                "b_run_id": run_id, "b_position": position, "b_attempt": attempt, "b_result": result,
                "b_locked_by": locked_by,
            })
            if not found:
                return Completion(None)
            row = found[0]
            run = prefixed(RunRow, row, "r_")  # locked now, whatever the statement did
            if row["done_name"] is not None:
                return self._completed_in_line(run, row)
            if run.process_state == _PROCESSING and run.paused_by is None and not run.linear:
                return self._completed_in_graph(run, position, attempt, result, locked_by)
        return self._step_by_step(run_id, position, attempt, result, locked_by, run)

    def complete_alone(self, run_id: str, position: int, attempt: int, result: Any, locked_by: str, *,
                       quiet: bool = False, last: bool = False) -> Completion | None:
        """:meth:`complete_and_advance` in one statement that is its own transaction (on
        PostgreSQL, in :meth:`Store.alone <sas_app.store.database.Store.alone>`), where that is all
        the completion writes: a straight line's run whose next step starts now, or which has none
        left and no concurrency key. None, with nothing changed, for any other reply (stale, a
        graph, a paused run, a back-off not over…): the caller takes it in a transaction.

        ``quiet`` says the run has no reply queue, and ``last`` that the step is its workflow's
        last, as the caller believes: a narrower statement is sent then (:data:`COMPLETE_NEXT` or
        :data:`COMPLETE_LAST`), which checks both and changes nothing where either is wrong."""
        statement = COMPLETE_ALONE if not quiet else COMPLETE_LAST if last else COMPLETE_NEXT
        found = rows(self.conn, statement, {
            "b_run_id": run_id, "b_position": position, "b_attempt": attempt, "b_result": result,
            "b_locked_by": locked_by,
        })
        if not found or found[0]["done_name"] is None:
            return None
        row = found[0]
        return self._completed_in_line(prefixed(RunRow, row, "r_"), row)

    def _completed_in_line(self, run: RunRow, row: dict[str, Any]) -> Completion:
        """What the one statement did: the notifications it wrote, to relay once committed, and
        the run's ending, if it ended it."""
        following = [] if row.get("n_id") is None else [prefixed(StepRow, row, "n_")]
        finished = bool(row["finished"])
        for note in row["notes"] or ():
            note_id = int(note["id"])
            self.tx.outbox.append(Notification(note_id, str(run.reply_to), {"id": note_id, **note["body"]}))
        if finished:
            self.runs.ended(run.id, run.workflow, run.parent_run_id, run.slot)
        return Completion(run, row["done_name"], following, finished, plan=not following and not finished)

    def _completed_in_graph(self, run: RunRow, position: int, attempt: int, result: Any,
                            locked_by: str) -> Completion:
        found = rows(self.conn, COMPLETE_IN_GRAPH, {
            "b_run_id": run.id, "b_position": position, "b_attempt": attempt, "b_result": result,
            "b_locked_by": locked_by,
        })
        if not found:
            return Completion(run)  # stale: fenced out
        first = found[0]
        started = [prefixed(StepRow, r, "n_") for r in found if r["n_id"] is not None]
        finished = bool(first["finished"])
        results = dict(first["results"] or {})
        if first["done_branch_of"] is None:
            results[first["done_name"]] = result
        self._notify_completed(run, first["done_name"], position, attempt, undo=False)
        if finished:
            self._announce_processed(run)
        plan = bool(first["ready_left"]) or (first["done_branch_of"] is not None and not first["siblings_open"])
        return Completion(run, first["done_name"], started, finished, plan, results)

    def _step_by_step(self, run_id: str, position: int, attempt: int, result: Any, locked_by: str,
                      locked: RunRow | None = None) -> Completion:
        run = locked or self.runs.lock_run(run_id)
        if run is None or run.process_state not in LIVE_RUN_STATES:
            return Completion(run)
        done = self.steps.complete_step(run_id, position, attempt, result, actor=locked_by)
        if done is None:
            return Completion(run)
        if done.compensates is not None:
            self.compensation.mark_compensated(run_id, done.compensates, locked_by)
        self._notify_completed(run, done.name, position, attempt, undo=done.is_undo)
        following, finished = None, False
        if not done.is_undo and run.linear and run.process_state == _PROCESSING and run.paused_by is None:
            following = self.steps.mark_next_running(run_id, position + 1, locked_by)
            if following is None and not self._has_later_step(run_id, position):
                finished = self.runs.finish_run(run_id, RunState.PROCESSED, actor=locked_by)
        started = [] if following is None else [following]
        return Completion(run, done.name, started, finished, plan=not started and not finished)

    def _announce_processed(self, run: RunRow) -> None:
        """What :meth:`update_run` does for a run that statement finished: its notification, and
        its parent's Scheduler asked, if it is a child run, and the next run waiting for its slot."""
        if run.reply_to is not None:
            self.tx.notify(run.id, run.reply_to, run.business_key, run.workflow, _PROCESSED, state=_PROCESSED)
        self.runs.ended(run.id, run.workflow, run.parent_run_id, run.slot)

    def _notify_completed(self, run: RunRow, name: str, position: int, attempt: int, *, undo: bool) -> None:
        if run.reply_to is not None:
            self.tx.notify(run.id, run.reply_to, run.business_key, run.workflow,
                           "step_undone" if undo else "step_completed", step=name, position=position, attempt=attempt)

    def _has_later_step(self, run_id: str, position: int) -> bool:
        return self.conn.execute(
            select(steps.c.id).where(steps.c.run_id == run_id, steps.c.position > position,
                                     steps.c.compensates.is_(None)).limit(1)
        ).first() is not None
