"""The vocabulary every part uses: exit codes, errors, outcomes, requests, records, units, settings.

Standard library only; shipped to peers.
"""
