"""``python -m dispatch`` is the same as the ``hostrun`` console script."""

from dispatch.cli.entry import entry

entry()
