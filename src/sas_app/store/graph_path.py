"""Completing a step of a run whose steps are not a straight line, on PostgreSQL, in one statement
after the run's lock: :data:`COMPLETE_IN_GRAPH`.

It completes the step (fenced on its attempt) and starts what that completion makes due: the
workflow steps that waited for it and for nothing else still open (a skipped step is not open),
or — for a branch of a ``for_each`` step — the next waiting branches its ``max_parallel`` has room
for; after the last workflow step it marks the run processed. It writes the events, in the order the step-by-step path
writes them, and returns the results the started steps' agents are told.

What it leaves to the Scheduler's planner (and says so): the last branch of a ``for_each`` step
(its step completes with the list of results), a ``for_each`` step that became due (its list is
read and its branches written), a child run's step, a sleep or a step with a condition that
became due, and a waiting step it could not start (a back-off not over).

The lock must come first, in a statement of its own: every sub-statement here sees the snapshot
taken when the statement starts, so a statement that waited for the lock inside would not see the
sibling whose completion it waited for, and a join would start never. The lock is what
:data:`sas_app.store.hot_path.COMPLETE_AND_ADVANCE` takes (it changes nothing on such a run).
"""

from __future__ import annotations

from sqlalchemy import Integer, String, bindparam, column, text
from sqlalchemy.dialects.postgresql import JSONB

from sas_app.states import EventKind, RunState, StepState
from sas_app.store.connection import PG_NOW
from sas_app.store.prepared import PREPARED
from sas_app.store.rows import StepRow, field_names, prefixed_columns
from sas_app.store.tables import steps
from sas_app.store.transitions import RUN_DONE_CHANNEL

_STEP_COLUMNS = field_names(StepRow)
_WAITING = f"('{StepState.NOT_STARTED}', '{StepState.PENDING}')"
_DUE = f"(not_before IS NULL OR not_before <= {PG_NOW})"
_SETTLED = f"('{StepState.COMPLETED}', '{StepState.SKIPPED}')"

COMPLETE_IN_GRAPH = text(f"""
WITH done AS (
    UPDATE steps SET state = '{StepState.COMPLETED}', result = :b_result, locked_by = NULL,
                     completed_at = {PG_NOW}, updated_at = {PG_NOW}
    WHERE run_id = :b_run_id AND position = :b_position AND state = '{StepState.RUNNING}'
      AND attempt = :b_attempt AND compensates IS NULL
    RETURNING position, attempt, name, branch_of
), parent AS (
    SELECT p.position, p.max_parallel FROM steps p JOIN done d ON p.position = d.branch_of
    WHERE p.run_id = :b_run_id AND p.state = '{StepState.RUNNING}'
), siblings AS (
    SELECT s.id, s.state, s.branch, s.not_before FROM steps s JOIN parent p ON s.branch_of = p.position
    WHERE s.run_id = :b_run_id AND s.position <> :b_position
), next_branches AS (
    SELECT w.id FROM (
        SELECT id, row_number() OVER (ORDER BY branch) AS n FROM siblings
        WHERE state IN {_WAITING} AND {_DUE}
    ) w
    WHERE w.n <= (SELECT max_parallel FROM parent)
                 - (SELECT count(*) FROM siblings WHERE state = '{StepState.RUNNING}')
), ready AS (
    SELECT s.id, s.for_each, s.child, s.sleep, s.sleep_until, s.event, s.not_before FROM steps s
    JOIN done d ON d.branch_of IS NULL
    WHERE s.run_id = :b_run_id AND s.compensates IS NULL AND s.branch_of IS NULL
      AND s.state IN {_WAITING} AND s.waits_for @> to_jsonb(d.position)
      AND NOT EXISTS (
          SELECT 1 FROM jsonb_array_elements_text(s.waits_for) w
          JOIN steps o ON o.run_id = :b_run_id AND o.position = CAST(w AS integer)
          WHERE o.position <> d.position AND o.state NOT IN {_SETTLED})
), started AS (
    UPDATE steps SET state = '{StepState.RUNNING}', attempt = steps.attempt + 1, locked_by = :b_locked_by,
                     complete_by = {PG_NOW} + steps.timeout, not_before = NULL, updated_at = {PG_NOW}
    WHERE steps.run_id = :b_run_id AND steps.id IN (SELECT id FROM next_branches
                       UNION ALL SELECT id FROM ready WHERE for_each IS NULL AND child IS NULL
                                               AND sleep IS NULL AND sleep_until IS NULL
                                               AND event IS NULL AND condition IS NULL AND {_DUE})
    RETURNING steps.*
), fin AS (
    UPDATE runs SET process_state = '{RunState.PROCESSED}', locked_by = NULL, complete_by = NULL,
                    updated_at = {PG_NOW}
    WHERE runs.id = :b_run_id AND EXISTS (SELECT 1 FROM done WHERE branch_of IS NULL)
      AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = :b_run_id AND s.compensates IS NULL
                      AND s.branch_of IS NULL AND s.position <> :b_position
                      AND s.state NOT IN {_SETTLED})
    RETURNING runs.id
), ev AS (
    INSERT INTO events (run_id, position, kind, from_state, to_state, attempt, actor, at, detail)
    SELECT run_id, position, '{EventKind.TRANSITION}', from_state, to_state, attempt, :b_locked_by, {PG_NOW}, detail
    FROM (
        SELECT 0 AS seq, :b_run_id AS run_id, d.position, '{StepState.RUNNING}' AS from_state,
               '{StepState.COMPLETED}' AS to_state, d.attempt, NULL::jsonb AS detail
        FROM done d
        UNION ALL
        SELECT 1 + n.position, :b_run_id, n.position,
               CASE WHEN n.attempt = 1 THEN '{StepState.NOT_STARTED}' ELSE '{StepState.PENDING}' END,
               '{StepState.RUNNING}', n.attempt, jsonb_build_object('complete_by', n.complete_by)
        FROM started n
        UNION ALL
        SELECT 1000000000, :b_run_id, NULL, '{RunState.PROCESSING}', '{RunState.PROCESSED}', NULL, NULL FROM fin
    ) e ORDER BY seq
), announce AS (
    SELECT pg_notify('{RUN_DONE_CHANNEL}', id) FROM fin
)
SELECT d.name AS done_name, d.branch_of AS done_branch_of,
       (SELECT count(*) FROM siblings WHERE state <> '{StepState.COMPLETED}') AS siblings_open,
       (SELECT count(*) FROM ready) - (SELECT count(*) FROM started WHERE branch_of IS NULL) AS ready_left,
       (SELECT count(*) FROM announce) AS finished,
       (SELECT jsonb_object_agg(name, result) FROM steps WHERE run_id = :b_run_id AND compensates IS NULL
            AND branch_of IS NULL AND result IS NOT NULL) AS results,
       {", ".join(f"n.{c} AS n_{c}" for c in _STEP_COLUMNS)}
FROM done d LEFT JOIN started n ON true
ORDER BY n.position
""").bindparams(bindparam("b_result", type_=JSONB)).columns(
    column("done_name", String()), column("done_branch_of", Integer()), column("siblings_open", Integer()),
    column("ready_left", Integer()), column("finished", Integer()), column("results", JSONB()),
    *prefixed_columns(steps, "n_", _STEP_COLUMNS),
).execution_options(**PREPARED)
