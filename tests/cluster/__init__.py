"""Tests against the private Slurm cluster (``slurmctld``/``slurmd`` on this machine, started by the
``slurm`` fixture)."""
