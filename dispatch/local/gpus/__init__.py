"""GPUs on this machine: the nvidia-smi fact, and VRAM out-of-memory detection in a job's output and
in the kernel log."""
