"""Pure tests: no root, no cgroups, no sshd, no second user, no VM, no cluster, no real client.
Run alone with ``pytest tests/fast`` (a minute or two)."""
