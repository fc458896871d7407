"""What hostrun hands ``ssh -o`` is read back by the real OpenSSH client as meant (``ssh -G`` prints
the options it parsed and expanded, without connecting): a state directory whose name holds a space,
a quote, a backslash or a percent sign must still name the ControlMaster socket's directory (before,
``ControlPath=/a b/%C`` was cut at the space and every ssh operation failed as "peer unreachable")."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from dispatch.hosts.ssh.transport import control_path_option
from tests.conftest import ON_CI

ODD = ["/tmp/a b", '/tmp/q"x', "/tmp/s'q", "/tmp/p%d", "/tmp/b\\s", "/tmp/all of 'it\" %%\\"]


@pytest.mark.parametrize("directory", ODD)
def test_ssh_reads_the_control_path_back_as_written(directory: str) -> None:
    if shutil.which("ssh") is None:
        if ON_CI:
            pytest.fail("CI=true but no ssh client (scripts/setup installs openssh-client)")
        pytest.skip("no ssh client")  # only off CI: with CI=true the line above fails instead
    done = subprocess.run(["ssh", "-G", "-F", "/dev/null", "-o", control_path_option(directory), "peer"],
                          capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("controlpath ")]
    path = line[len("controlpath "):]
    assert path.rsplit("/", 1)[0] == directory
    assert len(path.rsplit("/", 1)[1]) == 40  # %C: the connection's hash
