"""FAKES, NOT A DRIVER: these machines have no GPU and no nvidia-smi. A fake ``nvidia-smi`` first on
PATH that prints what a test wrote in the documented CSV format, a fake kernel log and a fake
/proc/driver/nvidia/gpus: a host with GPUs, as far as hostrun can tell."""

from __future__ import annotations

import os
from pathlib import Path

from dispatch.core.hostfacts import NVIDIA_PROC_ENV
from dispatch.local.gpus.gpu import (
    KERNEL_LOG_ENV,
)

# ----------------------------------------------------------------------------- the fake nvidia-smi
FAKE_SMI = """#!/bin/sh
# FAKE nvidia-smi for tests (no GPU here): prints the devices in gpus.csv next to this script.
dir=$(dirname "$0")
echo "$*" >> "$dir/calls"
[ -f "$dir/hang" ] && exec sleep 30
case "$1" in --query-compute-apps=*) [ -f "$dir/apps-fail" ] && exit 6 ;; esac
if [ -f "$dir/fail" ]; then cat "$dir/fail"; exit 9; fi
case "$1" in
  --query-gpu=*) cat "$dir/gpus.csv" ;;
  --query-compute-apps=*) if [ -f "$dir/apps.csv" ]; then cat "$dir/apps.csv"; fi ;;
  *) echo "fake nvidia-smi: unsupported: $*" >&2; exit 2 ;;
esac
"""


class FakeGpus:
    """A fake ``nvidia-smi`` first on PATH, a fake kernel log file (HOSTRUN_KERNEL_LOG) and a fake
    /proc/driver/nvidia/gpus with one GPU's entry in it (HOSTRUN_NVIDIA_PROC): a host with a GPU."""

    def __init__(self, tmp: Path) -> None:
        self.bin = tmp / "fakebin"
        self.bin.mkdir()
        smi = self.bin / "nvidia-smi"
        smi.write_text(FAKE_SMI)
        smi.chmod(0o755)
        self.gpus_file = self.bin / "gpus.csv"
        self.apps_file = self.bin / "apps.csv"
        self.kernel_log = tmp / "kern.log"
        self.kernel_log.write_text("[  1.0] an old boot line\n")
        self.nvidia_proc = tmp / "nvidia-gpus"
        (self.nvidia_proc / "0000:01:00.0").mkdir(parents=True)  # as the driver names it: PCI address
        (self.nvidia_proc / "0000:01:00.0" / "information").write_text("Model: NVIDIA Fake GPU\n")
        self.no_gpus = tmp / "no-nvidia-gpus"  # a driver with no GPU: the directory is empty
        self.no_gpus.mkdir()

    def set(self, *devices: tuple[int, int, int]) -> None:
        """Devices as (total MiB, used MiB, free MiB); index i gets UUID GPU-0000000i-…"""
        self.gpus_file.write_text("".join(
            f"{i}, {self.uuid(i)}, NVIDIA Fake GPU, {t}, {u}, {f}\n" for i, (t, u, f) in enumerate(devices)
        ))

    @staticmethod
    def uuid(i: int) -> str:
        return f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/bin:/bin')}"
        env[KERNEL_LOG_ENV] = str(self.kernel_log)
        env[NVIDIA_PROC_ENV] = str(self.nvidia_proc)
        env.update(extra)
        return env
