"""Tests that boot the test VM (Debian 12, systemd + cgroup v2, in qemu: ``tests/support/vm.py``)."""
