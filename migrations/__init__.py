"""Alembic migrations of the schema (shipped in the wheel as compactstore._migrations)."""
