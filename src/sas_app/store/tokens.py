"""API tokens (``sas token``): written once, found by id, revoked; never updated otherwise and
never deleted, so the audit trail's names stay meaningful."""

from __future__ import annotations

from sqlalchemy import Engine, insert, select, update

from sas_app.store.access_tables import api_tokens
from sas_app.store.connection import db_now
from sas_app.store.rows import TokenRow, as_row


class TokenQueries:
    engine: Engine

    def insert_token(self, token_id: str, name: str, role: str, secret_sha256: str, created_by: str,
                     lifetime: float) -> TokenRow:
        with self.engine.begin() as conn:
            conn.execute(insert(api_tokens).values(
                id=token_id, name=name, role=role, secret_sha256=secret_sha256, created_by=created_by,
                created_at=db_now(), expires_at=db_now() + lifetime))
            return as_row(TokenRow, conn.execute(select(api_tokens).where(api_tokens.c.id == token_id)).one())

    def token(self, token_id: str) -> tuple[TokenRow, float] | None:
        """The token with this id and the database's clock now (to judge its expiry by)."""
        with self.engine.connect() as conn:
            row = conn.execute(select(api_tokens, db_now().label("now")).where(api_tokens.c.id == token_id)).first()
        return None if row is None else (as_row(TokenRow, row), float(row.now))

    def tokens(self) -> list[TokenRow]:
        """Every token, newest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(api_tokens).order_by(api_tokens.c.created_at.desc()))
            return [as_row(TokenRow, r) for r in rows]

    def revoke_token(self, token_id: str, by: str) -> bool:
        """Revoke a live token; False when it was revoked already (or does not exist)."""
        with self.engine.begin() as conn:
            done = conn.execute(update(api_tokens).where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
                                .values(revoked_by=by, revoked_at=db_now()))
            return bool(done.rowcount == 1)
