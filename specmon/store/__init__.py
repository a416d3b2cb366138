"""The DuckDB store: one Store owns the database's connections; its schema and migrations, rollups and locks, and
the processes specmon starts, which end with it."""
