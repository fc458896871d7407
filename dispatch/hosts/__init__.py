"""Where a job runs: the host kinds and, for SSH peers, the transport, the sync and the agent bundle.

Controller only.
"""
