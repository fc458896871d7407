"""Running a job on the host this code runs on: book, admit, run capped, judge, record, release.

Standard library only; shipped to peers (the agent runs a peer's jobs with it).
"""
