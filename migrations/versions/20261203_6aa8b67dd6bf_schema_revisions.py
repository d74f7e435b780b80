"""schema_revisions: each revision applied to the database, with its parent and kind (additive)

the documentation: a version reads and writes a schema one additive
revision newer than its own. An older version cannot see the newer revision's file, so the
database says it: migrations/env.py records every revision applied from this one on (and,
when this one is applied, its ancestors) with its ``down_revision`` and ``kind``
(compactstore.db.migrate.record_revision). Versions before this one ignore the table.

Revision ID: 6aa8b67dd6bf
Revises: f4b2d8a6c1e9
Create Date: 2026-12-03 18:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "6aa8b67dd6bf"
down_revision: str | None = "f4b2d8a6c1e9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# A new table no older version reads.
kind: str = "additive"


def upgrade() -> None:
    op.create_table(
        "schema_revisions",
        sa.Column("revision", sa.String(length=32), nullable=False),
        sa.Column("down_revision", sa.String(length=32), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("revision", name=op.f("pk_schema_revisions")),
    )


def downgrade() -> None:
    op.drop_table("schema_revisions")
