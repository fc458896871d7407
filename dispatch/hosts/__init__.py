"""Where a job runs: the host kinds (``local``, and a package each for ``ssh`` and ``slurm``),
each a ``Host`` whose ``run`` is the one door into a run there.

Controller only.
"""

from __future__ import annotations

from dispatch.core.faces import lazy_attributes

# What the command line may use of this part (dispatch.core.faces), each loaded when first asked for.
SURFACE: dict[str, str] = {
    "HostDiagnosis": "dispatch.hosts.diagnosis",
    "Job": "dispatch.hosts.judgement",
    "LocalHost": "dispatch.hosts.local",
    "RunExtras": "dispatch.hosts.base",
    "host_for": "dispatch.hosts.kinds",
    "hosts_of": "dispatch.hosts.kinds",
    "machine_report": "dispatch.hosts.machine",
}
__all__ = ["HostDiagnosis", "Job", "LocalHost", "RunExtras", "host_for", "hosts_of", "machine_report"]
MYPY = False
if MYPY:
    from dispatch.hosts.base import RunExtras as RunExtras
    from dispatch.hosts.diagnosis import HostDiagnosis as HostDiagnosis
    from dispatch.hosts.judgement import Job as Job
    from dispatch.hosts.kinds import host_for as host_for
    from dispatch.hosts.kinds import hosts_of as hosts_of
    from dispatch.hosts.local import LocalHost as LocalHost
    from dispatch.hosts.machine import machine_report as machine_report

__getattr__ = lazy_attributes(__name__, SURFACE)
