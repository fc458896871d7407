"""Tests that need this machine as it is: root, real cgroups (v1 here), a real sshd peer, real rsync,
a second local user. A file here may hold pure tests beside them; ``pytest -m 'not system'`` picks
those out wherever they are."""
