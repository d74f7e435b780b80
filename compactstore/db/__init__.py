"""Database layer: engine setup, table shapes, migrations and queries."""
