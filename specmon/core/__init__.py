"""The bottom layer: the formulas, statistics, settings, times and text rules, pure (no I/O, no DuckDB, nothing
else of specmon)."""
