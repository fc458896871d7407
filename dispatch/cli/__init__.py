"""The ``hostrun`` command line: parse, call the library, render, exit.

Controller only; the one place that imports rich (``render``).
"""
