"""hostrun: run heavy developer jobs under a memory cap, booked in a shared ledger.

The runtime core (exitcodes, errors, units, settings, procinfo, ledger, capping, admission, runner,
report) uses the standard library only, so it can be shipped to a bare peer that has just python3.
pydantic lives in ``dispatch.config.model``; rich lives in ``dispatch.cli.render``.
"""

__version__ = "0.1.0"
