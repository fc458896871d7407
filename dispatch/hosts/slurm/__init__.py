"""The ``slurm`` kind: a Slurm cluster behind hostrun's command line, exit codes and peak history
(docs/slurm.md)."""
