"""model_calls: the cost and cache ledger (additive)

Each model call's prompt split as the provider bills it (uncached input, cache reads, cache
writes for the short and the long lifetime), its output tokens, the provider's iterations,
cache-miss reason and input transformations as reported (JSON text), the model, the cost in
US dollars, and the session's context version the call sent. All nullable: a row from
before this revision has none of them, and an older version ignores the columns.

Revision ID: 4c7e2a9b1f35
Revises: f3a5b3eeb8e4
Create Date: 2026-12-04 19:30:00.000000
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "4c7e2a9b1f35"
down_revision: str | None = "f3a5b3eeb8e4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Nullable columns; NULL is what an older version writes, and this one reads it as "no
# usage split reported" (the call counts, its tokens and cost are unknown).
kind: str = "additive"

_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("input_tokens", sa.Integer()),
    ("cache_read_tokens", sa.Integer()),
    ("cache_write_5m_tokens", sa.Integer()),
    ("cache_write_1h_tokens", sa.Integer()),
    ("output_tokens", sa.Integer()),
    ("iterations", sa.Text()),
    ("cache_miss_reason", sa.Text()),
    ("input_transformations", sa.Text()),
    ("model", sa.String(length=255)),
    ("cost_usd", sa.Numeric(precision=20, scale=10, asdecimal=False)),
    ("context_version", sa.Integer()),
)


def upgrade() -> None:
    for name, type_ in _COLUMNS:
        op.add_column("model_calls", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_calls", schema=None) as batch_op:
        for name, _ in reversed(_COLUMNS):
            batch_op.drop_column(name)
