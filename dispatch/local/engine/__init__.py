"""The admission engine: the resident process that queues and admits a state dir's runs, and a run's
side of it (connect, wait, park, the go)."""
