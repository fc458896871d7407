"""Whether and where a job may run: preflight headers, locks, work dirs, toolchains, trust.

Standard library only; shipped to peers.
"""
