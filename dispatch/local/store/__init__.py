"""The ledger's store, beneath the admission rules: its SQLite schema and file, the recovery of a
damaged one, the peak journal, the run records and the ramp profiles."""
