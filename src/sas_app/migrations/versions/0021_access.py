"""access: API tokens (stored as digests) and the audit trail of every action, which a trigger
keeps append-only

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

APPEND_ONLY = "the audit trail is append-only: its rows are never updated"


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("created_by", sa.String(200), nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
        sa.Column("revoked_by", sa.String(200)),
        sa.Column("revoked_at", sa.Double),
    )
    op.create_index("ix_api_tokens_name", "api_tokens", ["name"])
    op.create_table(
        "audit",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("via", sa.String(20), nullable=False),
        sa.Column("origin", sa.String(200), nullable=False),
        sa.Column("action", sa.String(40), nullable=False),
        sa.Column("run_id", sa.String(32)),
        sa.Column("target", sa.String(300)),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("outcome", sa.String(10), nullable=False),
        sa.Column("refusal", sa.Text),
        sa.Column("batch", sa.String(32)),
    )
    op.create_index("ix_audit_at", "audit", ["at"])
    op.create_index("ix_audit_run", "audit", ["run_id"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"""CREATE FUNCTION sas_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
                       BEGIN RAISE EXCEPTION '{APPEND_ONLY}'; END $$""")
        op.execute("CREATE TRIGGER audit_append_only BEFORE UPDATE ON audit "
                   "FOR EACH ROW EXECUTE FUNCTION sas_audit_append_only()")
    else:
        op.execute(f"CREATE TRIGGER audit_append_only BEFORE UPDATE ON audit "
                   f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY}'); END")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER audit_append_only ON audit")
        op.execute("DROP FUNCTION sas_audit_append_only()")
    op.drop_table("audit")
    op.drop_table("api_tokens")
