"""Capture: how rows become events. The triggers are SQL (``ferry.capture_table``); here are
the parts that run in Python: backfills of the rows a table already holds (``backfill``).
WAL capture will live here too."""
