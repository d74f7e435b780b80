"""Alembic environment.

Used two ways: by compactstore itself, which passes its own connection in
``config.attributes["connection"]`` (so the host application's logging is left alone), and
by ``alembic`` from the repository root, which reads the URL from ``-x db=URL``,
``COMPACTSTORE_DB`` or alembic.ini and sets up logging from the ini file.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from compactstore.db.engine import create_engine_for, normalize_url
from compactstore.db.migrate import record_revision
from compactstore.db.schema import metadata

config = context.config
target_metadata = metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        # Each revision applied or undone is recorded in schema_revisions with its kind.
        on_version_apply=record_revision,
    )
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("db") or os.environ.get("COMPACTSTORE_DB")
    return normalize_url(url or config.get_main_option("sqlalchemy.url") or "compactstore.db")


given = config.attributes.get("connection")
if given is not None:
    _run(given)
elif context.is_offline_mode():
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        on_version_apply=record_revision,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    if config.config_file_name is not None:
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    engine = create_engine_for(_url())
    try:
        with engine.connect() as connection:
            _run(connection)
            connection.commit()
    finally:
        engine.dispose()
