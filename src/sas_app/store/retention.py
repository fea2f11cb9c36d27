"""Retention: finished runs older than a cutoff, deleted with every row that refers to them —
steps, events, signals, alerts, outbox notifications — one bounded batch per transaction, so a
purge holds no lock on the hot path's rows for longer than a batch. A run that is not finished is
never deleted, nor a child run whose parent is not finished (its parent may not have read its end).
A purge also forgets the rate limits' schedules that have been idle a while (a row per key, a
tenant's say, when no Redis keeps them with an expiry): a schedule whose time has passed is read
as a free one, so deleting it changes nothing."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Engine, delete, exists, func, select, union_all

from sas_app.states import TERMINAL_RUN_STATES
from sas_app.store.connection import db_now
from sas_app.store.service_tables import rate_limits
from sas_app.store.tables import alerts, events, outbox, runs, signals, steps

_PARENT = runs.alias("parent")


def _old_enough(older_than: float):  # type: ignore[no-untyped-def]
    """A finished run's other conditions: it ended ``older_than`` seconds ago, and its parent, if
    it has one, has finished too."""
    cutoff = db_now() - older_than
    parent_not_done = exists(select(1).where(_PARENT.c.id == runs.c.parent_run_id,
                                             _PARENT.c.process_state.not_in(TERMINAL_RUN_STATES)))
    return runs.c.created_at < cutoff, runs.c.updated_at < cutoff, ~parent_not_done


def _finished(states: Sequence[str]) -> list[str]:
    """The finished states among ``states``, each once: the only ones a purge takes."""
    return sorted({s for s in states if s in TERMINAL_RUN_STATES})


def _purgeable(older_than: float, states: Sequence[str]):  # type: ignore[no-untyped-def]
    return runs.c.process_state.in_(_finished(states)), *_old_enough(older_than)


class RetentionQueries:
    engine: Engine

    def count_purgeable(self, older_than: float, states: Sequence[str]) -> int:
        """How many runs :meth:`purge_batch` would delete, in all."""
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(runs)
                                    .where(*_purgeable(older_than, states))).scalar_one())

    def purge_batch(self, older_than: float, states: Sequence[str], limit: int) -> tuple[int, int]:
        """Delete up to ``limit`` finished runs (in ``states``) that ended more than ``older_than``
        seconds ago, oldest first, and every row of theirs, in one transaction. Returns the runs
        and the rows deleted. Runs another transaction holds are left for a later batch, so a
        batch may delete fewer than ``limit`` while older runs remain."""
        chosen = _finished(states)
        if not chosen:
            return 0, 0
        # Each state's oldest, read from the index by state and age. The runs of the states a
        # purge does not take (error, unless named) stay at the head of the index of all runs by
        # age, and a walk from there reads past every one of them at every batch. BETWEEN, not "=":
        # with an equality the state drops out of the order asked for, and for a common state
        # PostgreSQL walks the index by age all the same.
        each = [select(runs.c.id, runs.c.created_at)
                .where(runs.c.process_state.between(state, state), *_old_enough(older_than))
                .order_by(runs.c.process_state, runs.c.created_at).limit(limit).subquery() for state in chosen]
        oldest = union_all(*(select(part.c.id, part.c.created_at) for part in each)).subquery()
        candidates = select(oldest.c.id).order_by(oldest.c.created_at).limit(limit)
        with self.engine.begin() as conn:
            ids = list(conn.execute(
                select(runs.c.id).where(runs.c.id.in_(candidates), *_purgeable(older_than, states))
                .with_for_update(skip_locked=True, of=runs)
            ).scalars())
            if not ids:
                return 0, 0
            rows = 0
            for table in (events, alerts, outbox, signals, steps):
                rows += conn.execute(delete(table).where(table.c.run_id.in_(ids))).rowcount
            rows += conn.execute(delete(runs).where(runs.c.id.in_(ids))).rowcount
            return len(ids), rows

    def purge_idle_rate_limits(self, idle_for: float) -> int:
        """Delete the rate limits' schedules and lines whose time passed more than ``idle_for``
        seconds ago; how many. A reservation holding one (moving its time on) keeps it: the
        delete waits for it and finds the row's new time."""
        with self.engine.begin() as conn:
            return int(conn.execute(delete(rate_limits).where(rate_limits.c.next_at < db_now() - idle_for)).rowcount)
