"""Admission: the ledger, and the rules that decide whether a booking starts now (room, backfill,
lending) and how a job is booked."""
