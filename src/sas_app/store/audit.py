"""The audit trail (``sas audit``, the dashboard's Audit page): rows appended, read by filter, and
deleted only by the trail's own retention, oldest first, in bounded batches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, delete, insert, select

from sas_app.store.access_tables import audit
from sas_app.store.connection import db_now
from sas_app.store.queries import like_literal
from sas_app.store.rows import AuditRow, as_row


class AuditQueries:
    engine: Engine

    def append_audit(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """Append these rows (each the columns of :class:`AuditRow` but ``id`` and ``at``) in one transaction."""
        if entries:
            with self.engine.begin() as conn:
                conn.execute(insert(audit).values(at=db_now()), list(entries))

    def audit_rows(self, *, actor: str | None = None, action: str | None = None, run_id: str | None = None,
                   outcome: str | None = None, via: str | None = None, since: float | None = None,
                   before_id: int | None = None, limit: int = 100) -> list[AuditRow]:
        """Newest first, filtered (``actor`` a prefix); ``before_id`` pages on from a row's id."""
        query = select(audit).order_by(audit.c.id.desc()).limit(limit)
        if actor is not None:
            query = query.where(audit.c.actor.like(like_literal(actor) + "%", escape="\\"))
        for name, value in (("action", action), ("run_id", run_id), ("outcome", outcome), ("via", via)):
            if value is not None:
                query = query.where(audit.c[name] == value)
        if since is not None:
            query = query.where(audit.c.at >= since)
        if before_id is not None:
            query = query.where(audit.c.id < before_id)
        with self.engine.connect() as conn:
            return [as_row(AuditRow, r) for r in conn.execute(query)]

    def purge_audit(self, older_than: float, limit: int) -> int:
        """Delete up to ``limit`` of the trail's rows older than ``older_than`` seconds, oldest first."""
        with self.engine.begin() as conn:
            ids = list(conn.execute(select(audit.c.id).where(audit.c.at < db_now() - older_than)
                                    .order_by(audit.c.id).limit(limit)).scalars())
            if not ids:
                return 0
            return int(conn.execute(delete(audit).where(audit.c.id.in_(ids))).rowcount)
