"""The tables of runs, named as the pattern names them: ``runs``, ``steps``, ``events``, and what
belongs to a run beside them (``signals``, ``outbox``, ``alerts``); the service's own tables are in
:mod:`sas_app.store.service_tables`, the whole schema in :mod:`sas_app.store.schema`.

Times are seconds since the epoch (``DOUBLE PRECISION``), always taken from the database's clock
(:class:`sas_app.store.connection.db_now`), so hosts whose clocks disagree still agree on whether a
complete-by has passed. In psql, ``to_timestamp(complete_by)`` shows one as a date. The values of
the state and kind columns are the enums of :mod:`sas_app.states`.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB

from sas_app.states import RUN_STATES, STEP_STATES, StepState

metadata = MetaData()


_json = JSON().with_variant(JSONB(), "postgresql")
_event_id = BigInteger().with_variant(Integer(), "sqlite")

#: the run states in which a run's complete-by is due: pending (to be picked up), processing or
#: compensating (asked about, to be looked at: see RunTx.ask)
DUE_RUN_STATES = ("pending", "processing", "compensating")
#: the predicates of the Supervisor's partial indexes (migrations 0015, 0017)
RUNS_DUE = "complete_by IS NOT NULL AND process_state IN ('pending', 'processing', 'compensating')"
STEPS_LIVE_DUE = "complete_by IS NOT NULL AND state IN ('pending', 'running')"
#: the predicate of the partial index of steps running with no complete-by of their own (migration 0023)
STEPS_RUNNING_UNTIMED = "state = 'running' AND complete_by IS NULL"

# One row per run: the pattern's ProcessState (``process_state``), its payload, who holds it now
# (``locked_by``) and when the Supervisor looks at it next (``complete_by``), its deadline, its
# place in a schedule, a concurrency key or a parent run.
runs = Table(
    "runs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("workflow", String(200), nullable=False),
    # The pattern's OrderID: unique per workflow, so a resubmitted request is deduplicated.
    Column("business_key", String(200), nullable=False),
    Column("payload", _json, nullable=False),
    Column("process_state", String(20), nullable=False, server_default="pending"),
    Column("locked_by", String(200)),
    # While pending: the time by which a Scheduler must have picked the run up; while processing or
    # compensating, if set: by which it must have looked at the run it was asked about (RunTx.ask).
    Column("complete_by", Double),
    Column("failure_count", Integer, nullable=False, server_default="0"),
    Column("reply_to", String(200)),
    Column("error", Text),
    # Who cancelled the run (it ends ``cancelled`` once undone) and who paused it, if anyone.
    Column("cancelled_by", String(200)),
    Column("paused_by", String(200)),
    # 0 (least urgent) to 9 (most urgent): its agent messages overtake less urgent ones.
    Column("priority", Integer, nullable=False, server_default="5"),
    # The version of the workflow's definition the run started with (its steps are a copy of it).
    Column("version", String(100)),
    # Each step waits for the one before and none fans out: the Scheduler's one-statement path.
    Column("linear", Boolean, nullable=False, server_default=true()),
    # A child run: the run and the position of the step that started it, and how deep it nests.
    Column("parent_run_id", String(32)),
    Column("parent_position", Integer),
    Column("depth", Integer, nullable=False, server_default="0"),
    # One run at a time per key: the value of the workflow's concurrency key in the payload, how
    # many runs with it may be live at once, and since when it holds a slot (processing) or waits
    # for one (pending).
    Column("slot", String(300)),
    Column("max_running", Integer),
    Column("slot_since", Double),
    # A run a schedule started (its business key is the schedule and the tick).
    Column("schedule", String(100)),
    # The time by which the whole run must have ended (its workflow's ``deadline`` after submit).
    Column("deadline", Double),
    # A rerun after a fix: the run it reruns and the step it reran from; on the old run, its rerun
    # (set once: a run is rerun at most once, so a bulk rerun done twice starts nothing twice).
    Column("rerun_of", String(32)),
    Column("rerun_from", String(200)),
    Column("rerun_as", String(32)),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    UniqueConstraint("workflow", "business_key", name="uq_runs_workflow_business_key"),
)
# The Supervisor's search for runs whose Scheduler's message was lost: only live runs with a due
# time are indexed. ``complete_by IS NOT NULL`` keeps the index out of the way of a fenced update
# of one run ("this id, if still pending"), which implies the rest of the predicate: with the
# statistics taken before a burst of submits, the planner would walk every pending run there
# instead of the primary key.
Index(
    "ix_runs_due",
    runs.c.complete_by,
    postgresql_where=text(RUNS_DUE),
    sqlite_where=text(RUNS_DUE),
)
# A schedule's live runs (its overlap policy).
Index("ix_runs_schedule", runs.c.schedule, runs.c.process_state, postgresql_where=text("schedule IS NOT NULL"),
      sqlite_where=text("schedule IS NOT NULL"))
# The runs sharing a concurrency key, in submission order (claiming a slot, freeing one).
Index("ix_runs_slot", runs.c.workflow, runs.c.slot, runs.c.process_state, runs.c.created_at,
      postgresql_where=text("slot IS NOT NULL"), sqlite_where=text("slot IS NOT NULL"))
# The Supervisor's search for live runs past their deadline: only runs that have one, while live.
Index(
    "ix_runs_deadline",
    runs.c.deadline,
    postgresql_where=text("deadline IS NOT NULL AND process_state IN ('pending', 'processing')"),
    sqlite_where=text("deadline IS NOT NULL AND process_state IN ('pending', 'processing')"),
)
Index("ix_runs_state_created", runs.c.process_state, runs.c.created_at)
# The newest runs and runs submitted over time, whatever their state (the dashboard, `sas runs`).
Index("ix_runs_created", runs.c.created_at)
# A run's children (the planner reads them; the Supervisor looks for children that ended).
Index("ix_runs_parent", runs.c.parent_run_id, postgresql_where=text("parent_run_id IS NOT NULL"),
      sqlite_where=text("parent_run_id IS NOT NULL"))

# One row per step of a run (and per branch of a fan-out): its state, its attempt (the fencing
# token), its complete-by and failure count, its result or error, and what it waits for in the
# store (a sleep, an event, a child run).
steps = Table(
    "steps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(32), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("position", Integer, nullable=False),
    Column("name", String(200), nullable=False),
    Column("agent", String(200), nullable=False),
    Column("action", String(200), nullable=False),
    Column("state", String(20), nullable=False, server_default="not_started"),
    # The fencing token: raised on every dispatch; a reply or a sweep naming another attempt
    # changes nothing.
    Column("attempt", Integer, nullable=False, server_default="0"),
    Column("locked_by", String(200)),
    Column("complete_by", Double),
    Column("not_before", Double),
    Column("timeout", Double, nullable=False),
    Column("max_failures", Integer, nullable=False),
    Column("failure_count", Integer, nullable=False, server_default="0"),
    # Stable across every attempt; the remote service deduplicates on it.
    Column("idempotency_key", String(300), nullable=False),
    # The agent action (``agent.action``) that undoes this step, if it has one.
    Column("undo", String(401)),
    # On a compensation row: the position of the step it undoes (NULL on the workflow's own steps).
    Column("compensates", Integer),
    # The positions of the workflow steps this one waits for (NULL: the step before it, as every
    # run written before steps could run in parallel).
    Column("waits_for", _json),
    # On a step that fans out: where its list is (``items``, ``reserve_stock.items``) and how many
    # of its branches may run at once.
    Column("for_each", String(300)),
    Column("max_parallel", Integer),
    # On a branch: the position of the step it is a branch of, its index and its element.
    Column("branch_of", Integer),
    Column("branch", Integer),
    Column("item", _json),
    # On a step that starts a child run: the child's workflow.
    Column("child", String(200)),
    # On a sleep: how long, or where the time to wake is (a payload or result key).
    Column("sleep", Double),
    Column("sleep_until", String(300)),
    # At its failure threshold: {"wait", "retries", "then"} (the pattern's escalation), and the
    # rungs taken.
    Column("escalate", _json),
    Column("escalated", Integer, nullable=False, server_default="0"),
    # On a wait: the event it waits for, and what its timeout (``timeout``) does.
    Column("event", String(100)),
    Column("on_timeout", String(20)),
    # An operator's edited input for this step, sent instead of the run's payload.
    Column("input", _json),
    Column("result", _json),
    Column("error", Text),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("completed_at", Double),
    # Its condition (``when quote.express``, ``unless is_small()``): the planner decides it, and a
    # step not taken ends ``skipped`` with the reason in ``error``.
    Column("condition", String(300)),
    # A polling step: {"every", "max_wait"}, how many times its action answered "not yet", and
    # the time past which it fails (its first "not yet" plus max_wait).
    Column("poll", _json),
    Column("polls", Integer, nullable=False, server_default="0"),
    Column("poll_until", Double),
    UniqueConstraint("run_id", "position", name="uq_steps_run_position"),
)
# The sweep reads only live steps (pending or running), ordered by complete-by: its cost follows
# the number of live steps past their deadline, not the size of the table. (``complete_by IS NOT
# NULL``: as for ix_runs_due, so that a fenced update of one step keeps to the
# primary key, however many steps are in flight.)
Index(
    "ix_steps_live_complete_by",
    steps.c.complete_by,
    postgresql_where=text(STEPS_LIVE_DUE),
    sqlite_where=text(STEPS_LIVE_DUE),
)
# The steps running with no complete-by of their own: each waits for its child run, or for its
# fan-out's branches. The Supervisor's look for children that ended starts from them, so it reads
# the steps in that wait, never the whole table; a step with a complete-by (every step an agent
# runs) has no entry, so the hot path writes none.
Index(
    "ix_steps_running_untimed",
    steps.c.run_id,
    steps.c.position,
    postgresql_where=text(STEPS_RUNNING_UNTIMED),
    sqlite_where=text(STEPS_RUNNING_UNTIMED),
)
# The steps waiting in the store (asleep, or for an event), by kind: what sas_runs_waiting counts.
Index(
    "ix_steps_waiting",
    steps.c.event,
    postgresql_where=text("state = 'pending' AND (sleep IS NOT NULL OR sleep_until IS NOT NULL OR event IS NOT NULL)"),
    sqlite_where=text("state = 'pending' AND (sleep IS NOT NULL OR sleep_until IS NOT NULL OR event IS NOT NULL)"),
)

#: a step of a paused run that is due to be sent (a query joining ``steps`` and ``runs``): it
#: waits for the run's resume, which asks the Scheduler about it — no worker could take it, and
#: the Supervisor does not chase it meanwhile
WAITING_FOR_RESUME = and_(steps.c.state == StepState.PENDING.value, runs.c.paused_by.is_not(None))

# A run's history, append-only: every transition of the run and its steps, alerts, operators'
# actions, signals and refused late replies, with who did it and when.
events = Table(
    "events",
    metadata,
    Column("id", _event_id, primary_key=True, autoincrement=True),
    Column("run_id", String(32), nullable=False),
    Column("position", Integer),
    # an EventKind (sas_app.states)
    Column("kind", String(30), nullable=False),
    Column("from_state", String(20)),
    Column("to_state", String(20)),
    Column("attempt", Integer),
    Column("actor", String(200)),
    Column("at", Double, nullable=False),
    Column("detail", _json),
    # on SQLite, never an id given twice: without it a new row takes the largest id plus one, and
    # after a purge of the newest events the next ones would take their ids (PostgreSQL's sequence
    # never gives one twice)
    sqlite_autoincrement=True,
)
Index("ix_events_run", events.c.run_id, events.c.id)


# Signals sent to runs (``sas.signal``): every one is recorded; a wait consumes the first ``kept``
# one for its event, whether it came before the run reached the wait or while it waited.
signals = Table(
    "signals",
    metadata,
    Column("id", _event_id, primary_key=True, autoincrement=True),
    Column("run_id", String(32), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("event", String(100), nullable=False),
    Column("payload", _json),
    # a SignalStatus: kept (not consumed yet), consumed, ignored (a duplicate)
    Column("status", String(10), nullable=False),
    # the wait that consumed it
    Column("position", Integer),
    Column("sent_by", String(200)),
    Column("received_at", Double, nullable=False),
)
Index("ix_signals_run_event", signals.c.run_id, signals.c.event)


# Progress notifications for submitters that gave a ``reply_to`` queue: written in the same
# transaction as the state change they report, relayed to the broker after the commit. A row not
# yet relayed (its relayer died) is relayed by the Supervisor's sweep, under the same id.
outbox = Table(
    "outbox",
    metadata,
    Column("id", _event_id, primary_key=True, autoincrement=True),
    Column("run_id", String(32), nullable=False),
    Column("reply_to", String(200), nullable=False),
    Column("body", _json, nullable=False),
    Column("created_at", Double, nullable=False),
    Column("sent_at", Double),
)
# A run's notifications (retention deleting a run's rows).
Index("ix_outbox_run", outbox.c.run_id)
Index(
    "ix_outbox_unsent",
    outbox.c.created_at,
    postgresql_where=text("sent_at IS NULL"),
    sqlite_where=text("sent_at IS NULL"),
)


# One row per alert raised; ``dedup_key`` makes raising the same alert twice a no-op (a failure
# per step attempt, an at-risk warning per step).
alerts = Table(
    "alerts",
    metadata,
    Column("id", _event_id, primary_key=True, autoincrement=True),
    Column("dedup_key", String(300), nullable=False, unique=True),
    Column("run_id", String(32), nullable=False),
    Column("position", Integer),
    Column("kind", String(30), nullable=False),
    Column("attempt", Integer),
    Column("reason", Text, nullable=False),
    Column("at", Double, nullable=False),
)
Index("ix_alerts_at", alerts.c.at)
# A run's alerts (its page; retention deleting a run's rows).
Index("ix_alerts_run", alerts.c.run_id)


__all__ = ["RUN_STATES", "STEP_STATES", "alerts", "events", "metadata", "outbox", "runs", "signals", "steps"]
