"""Who may act and what they did: the API's tokens and the audit trail. Times are the database's
clock, as in :mod:`sas_app.store.tables`."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Double, Index, Integer, String, Table, Text

from sas_app.store.tables import metadata

# One row per API token (``sas token create``): its secret only as a SHA-256 digest, so the table
# read by someone else gives no token; a revoked or expired token stays, for the audit trail's sake.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", String(16), primary_key=True),
    Column("name", String(100), nullable=False),
    Column("role", String(20), nullable=False),
    Column("secret_sha256", String(64), nullable=False),
    Column("created_by", String(200), nullable=False),
    Column("created_at", Double, nullable=False),
    Column("expires_at", Double, nullable=False),
    Column("revoked_by", String(200)),
    Column("revoked_at", Double),
)
Index("ix_api_tokens_name", api_tokens.c.name)


# Every action taken through the dashboard, the API and the CLI, and its outcome: appended, never
# updated (a trigger refuses it), deleted only by the trail's own retention. A bulk action writes
# one row per run, with the same ``batch``.
audit = Table(
    "audit",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True),
    Column("at", Double, nullable=False),
    # who: a user, or a token's name; the role they held; the door (cli, api, dashboard, broker)
    # and where from (an address, or the OS user and host of a CLI)
    Column("actor", String(200), nullable=False),
    Column("role", String(20), nullable=False),
    Column("via", String(20), nullable=False),
    Column("origin", String(200), nullable=False),
    # what: the action, the run it applied to, and what else names it (a step, a workflow, a token)
    Column("action", String(40), nullable=False),
    Column("run_id", String(32)),
    Column("target", String(300)),
    Column("reason", Text, nullable=False),
    # done or refused, with the refusal's words
    Column("outcome", String(10), nullable=False),
    Column("refusal", Text),
    Column("batch", String(32)),
)
Index("ix_audit_at", audit.c.at)
Index("ix_audit_run", audit.c.run_id)
