"""Drift: the CUSUM detector, its calibration, its state kept in the database, and the alarms per run."""
