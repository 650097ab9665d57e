"""The event log: ticks (ticker), batches and cursors (reader), retention (maintenance)."""
