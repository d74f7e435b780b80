"""edit policy: the session's model and thinking binding, each compaction's policy (additive)

``sessions.model``: the model the session talks to (``store.session(model=)`` or the model of
the newest ``append_response``), which decides the ``auto`` edit policy through the model
capability table. ``sessions.thinking_binding``: ``"drop_block"`` once a cut inside a tool loop
changed the prefix of thinking a later request must still send; every later request of the
session then carries ``thinking.block_binding.prefix_mismatch_behavior: "drop_block"``.
``sessions.thinking_binding_at``: when it was set. ``compactions.edit_policy``: the policy
(``rewrite`` or ``append_only``) the compaction ran under. All nullable: an older version
ignores them (its compactions record no policy; it never sets the binding).

Revision ID: 9c1e4b7d2a58
Revises: 4c7e2a9b1f35
Create Date: 2026-12-04 19:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9c1e4b7d2a58"
down_revision: str | None = "4c7e2a9b1f35"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# Nullable columns an older version neither reads nor writes.
kind: str = "additive"


def upgrade() -> None:
    op.add_column("sessions", sa.Column("model", sa.String(length=255), nullable=True))
    op.add_column("sessions", sa.Column("thinking_binding", sa.String(length=16), nullable=True))
    op.add_column("sessions", sa.Column("thinking_binding_at", sa.Float(), nullable=True))
    op.add_column("compactions", sa.Column("edit_policy", sa.String(length=16), nullable=True))


def downgrade() -> None:
    op.drop_column("compactions", "edit_policy")
    op.drop_column("sessions", "thinking_binding_at")
    op.drop_column("sessions", "thinking_binding")
    op.drop_column("sessions", "model")
