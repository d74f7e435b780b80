"""compaction_configs: each distinct config a session compacted under, stored once (breaking)

Every compactions row carried a full copy of its config's JSON (about 2.9 of the 4.1 KB a
demo turn wrote). The config now lives once per session in ``compaction_configs``, keyed by
the SHA-256 of its JSON, and ``compactions.config_hash`` names it; ``compactions.config``
stays (NOT NULL) and holds '' in rows that have a hash. Upgrading moves the configs of
existing rows into the new table; downgrading copies them back.

Only tables and a nullable column are added, but the revision is breaking: an older
version replays a compaction with the JSON in ``compactions.config``, which rows written
from this revision on (and the rows it moved) no longer hold. Stop older versions first.

Revision ID: f99d9de77ba8
Revises: 6aa8b67dd6bf
Create Date: 2026-12-04 19:00:00.000000
"""

import hashlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f99d9de77ba8"
down_revision: str | None = "6aa8b67dd6bf"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None
# An older version would find '' where it reads the config it replays with.
kind: str = "breaking"

_compactions = sa.table(
    "compactions",
    sa.column("session_id", sa.String),
    sa.column("config", sa.Text),
    sa.column("config_hash", sa.String),
)
_configs = sa.table(
    "compaction_configs",
    sa.column("session_id", sa.String),
    sa.column("hash", sa.String),
    sa.column("config", sa.Text),
)


def upgrade() -> None:
    op.create_table(
        "compaction_configs",
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_compaction_configs_session_id_sessions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "hash", name=op.f("pk_compaction_configs")),
    )
    op.add_column("compactions", sa.Column("config_hash", sa.String(length=64), nullable=True))
    bind = op.get_bind()
    found = bind.execute(
        sa.select(_compactions.c.session_id, _compactions.c.config)
        .where(_compactions.c.config_hash.is_(None), _compactions.c.config != "")
        .distinct()
    ).all()
    for session_id, config in found:
        digest = hashlib.sha256(config.encode("utf-8")).hexdigest()
        bind.execute(sa.insert(_configs).values(session_id=session_id, hash=digest, config=config))
        bind.execute(
            sa.update(_compactions)
            .where(
                _compactions.c.session_id == session_id,
                _compactions.c.config_hash.is_(None),
                _compactions.c.config == config,
            )
            .values(config_hash=digest, config="")
        )


def downgrade() -> None:
    bind = op.get_bind()
    for session_id, digest, config in bind.execute(
        sa.select(_configs.c.session_id, _configs.c.hash, _configs.c.config)
    ).all():
        bind.execute(
            sa.update(_compactions)
            .where(_compactions.c.session_id == session_id, _compactions.c.config_hash == digest)
            .values(config=config)
        )
    op.drop_column("compactions", "config_hash")
    op.drop_table("compaction_configs")
