"""Deciding where a job goes: reading hosts' reports, judging them, pending bookings, alerts.

Controller only.
"""
