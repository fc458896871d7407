"""GPU memory: the nvidia-smi fact, VRAM-aware booking, teed output and exit 245.

FAKES, NOT A DRIVER: these machines have no GPU and no nvidia-smi. Every ``nvidia-smi`` here is a
small shell script put first on PATH that prints devices from a file the test writes, and the kernel
log is a plain file named by ``HOSTRUN_KERNEL_LOG`` (hostrun's test hook) instead of /dev/kmsg. So
these tests check our parsing of nvidia-smi's documented CSV output and our protocol (booking, FIFO,
CUDA_VISIBLE_DEVICES, output forwarding, the 245 rules), not a real driver or a real CUDA OOM. The
nvidia-smi texts below are WRITTEN to match the documented format (``--format=csv,noheader,nounits``:
fields joined by ", ", MiB, ``[N/A]``/``[Not Supported]`` where a device does not report a figure,
names unquoted) and outputs quoted in public bug reports. The exception: ``tests/recorded/h200-*``
were recorded on a real NVIDIA H200 (driver 580.159.04, PyTorch 2.11) by ``scripts/gpu-check`` on a
GPU machine lent to one session (not CI); there a real PyTorch and JAX CUDA OOM through hostrun exited
245, a caught one 0 with the warning, and CuPy's wording was found missing (now in OUTPUT_PATTERNS). Only
the /dev/kmsg test touches a real kernel interface (it writes a harmless marker, never the pattern).

End-to-end tests run the real CLI against a real cgroup v1 slice and ledger (the ``hostrun`` fixture,
whose teardown fails the test on any leftover process, cgroup or booking).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from dispatch.core.errors import GpuError
from dispatch.core.hostfacts import NVIDIA_PROC_ENV, has_nvidia_gpus
from dispatch.core.procinfo import start_time
from dispatch.local.admission.ledger import Ledger
from dispatch.local.admission.policy import Admission, Room, choose_gpu
from dispatch.local.admission.rooms import status_line, wait_reason
from dispatch.local.gpus.gpu import (
    KERNEL_LOG_ENV,
    KERNEL_PATTERNS,
    OUTPUT_PATTERNS,
    QUERY_APPS,
    QUERY_GPUS,
    Gpu,
    GpuApp,
    GpuSnapshot,
    KernelLog,
    PatternScanner,
    device_environment,
    gpu_rooms,
    parse_apps,
    parse_gpus,
    read_gpus,
    visible,
)
from dispatch.local.store.ledgerdb import SCHEMA_VERSION, Booking, NewBooking
from tests.conftest import Hostrun, wait_for
from tests.support.gpus import FakeGpus

PY = sys.executable
MiB, GiB = 1 << 20, 1 << 30

# ------------------------------------------------------------------------ nvidia-smi texts (written)
ONE_GPU = "0, GPU-5f0c1a0e-8f8b-2b46-0f3a-6b3d8e0f6f6e, NVIDIA GeForce RTX 3090, 24576, 1187, 23085\n"

EIGHT_GPUS = "".join(
    f"{i}, GPU-{i:08x}-1111-2222-3333-444455556666, NVIDIA H100 80GB HBM3, 81559, {used}, {81559 - used}\n"
    for i, used in enumerate([4, 70000, 512, 81000, 4, 4, 40000, 12])
)

# GB10/DGX Spark (unified memory) reports no memory figures; older drivers said [Not Supported].
NOT_REPORTED = (
    "0, GPU-11111111-2222-3333-4444-555555555555, NVIDIA GB10, [N/A], [N/A], [N/A]\n"
    "1, GPU-66666666-7777-8888-9999-000000000000, Tesla K80, [Not Supported], 10, [Not Supported]\n"
)

# vGPU/MIG-style names may contain ", "; nvidia-smi does not quote them. A quoted name (as a CSV
# writer would produce) is accepted too.
ODD_NAMES = (
    "0, GPU-aaaaaaaa-0000-0000-0000-000000000000, GRID A100-4C, vGPU, profile 4, 4096, 0, 4096\n"
    '1, GPU-bbbbbbbb-0000-0000-0000-000000000000, "NVIDIA A100, MIG 1g.10gb ""x""", 81920, 20, 81900\n'
)


def test_parse_one_gpu() -> None:
    assert parse_gpus(ONE_GPU) == [Gpu(index=0, uuid="GPU-5f0c1a0e-8f8b-2b46-0f3a-6b3d8e0f6f6e",
                                       name="NVIDIA GeForce RTX 3090", total=24576 * MiB,
                                       used=1187 * MiB, free=23085 * MiB)]


def test_parse_eight_gpus() -> None:
    gpus = parse_gpus(EIGHT_GPUS)
    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert all(g.total == 81559 * MiB for g in gpus)
    assert gpus[3].used == 81000 * MiB and gpus[3].free == 559 * MiB
    assert len({g.uuid for g in gpus}) == 8


def test_parse_not_reported_fields_are_none() -> None:
    a, b = parse_gpus(NOT_REPORTED)
    assert (a.name, a.total, a.used, a.free) == ("NVIDIA GB10", None, None, None)
    assert (b.total, b.used, b.free) == (None, 10 * MiB, None)


def test_parse_names_with_commas_and_quotes() -> None:
    a, b = parse_gpus(ODD_NAMES)
    assert a.name == "GRID A100-4C, vGPU, profile 4" and a.total == 4096 * MiB and a.free == 4096 * MiB
    assert b.name == 'NVIDIA A100, MIG 1g.10gb "x"' and b.used == 20 * MiB and b.index == 1


RECORDED = Path(__file__).resolve().parents[1] / "recorded"


def test_parse_recorded_h200_answers() -> None:
    """nvidia-smi 580.159.04 on a real H200 (recorded by scripts/gpu-check on a lent GPU machine)."""
    (gpu,) = parse_gpus((RECORDED / "h200-query-gpu.txt").read_text())
    assert gpu == Gpu(index=0, uuid="GPU-09f17fe3-06d3-ee33-36f6-2cfb1bd871aa", name="NVIDIA H200",
                      total=143771 * MiB, used=0, free=143156 * MiB)
    (app,) = parse_apps((RECORDED / "h200-query-compute-apps.txt").read_text())
    assert (app.uuid, app.pid, app.used) == (gpu.uuid, 454, 8710 * MiB)


@pytest.mark.parametrize(("output", "found"), [
    ((RECORDED / "h200-torch-oom-stderr.txt").read_bytes(), b"CUDA out of memory"),
    # CuPy 14 on the same H200: the only OOM words in its traceback.
    (b"cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 429,496,729,600 bytes "
     b"(allocated so far: 0 bytes).\n", b"OutOfMemoryError: Out of memory allocating"),
])
def test_recorded_real_oom_output_is_recognised(output: bytes, found: bytes) -> None:
    scanner = PatternScanner(OUTPUT_PATTERNS)
    assert scanner.feed(output) == found


def test_parse_skips_what_is_not_a_device_row() -> None:
    text = "\n" + ONE_GPU + "WARNING: infoROM is corrupted at gpu 0000:01:00.0\nNo devices were found\n"
    assert [g.index for g in parse_gpus(text)] == [0]
    assert parse_gpus("") == []


def test_parse_apps() -> None:
    text = ("GPU-aaaa, 4121, 6144\n"
            "GPU-aaaa, 4122, [N/A]\n"
            "GPU-bbbb, 977, 100\n")
    assert parse_apps(text) == [GpuApp("GPU-aaaa", 4121, 6144 * MiB), GpuApp("GPU-aaaa", 4122, None),
                                GpuApp("GPU-bbbb", 977, 100 * MiB)]
    assert parse_apps("No running processes found\n") == []


def test_visible_follows_cuda_visible_devices() -> None:
    gpus = parse_gpus(EIGHT_GPUS)
    assert visible(gpus, None) == gpus
    assert [g.index for g in visible(gpus, "3,1")] == [3, 1]
    assert [g.index for g in visible(gpus, "GPU-00000005")] == [5]  # a UUID prefix, as CUDA takes
    assert [g.index for g in visible(gpus, "0,9,1")] == [0]  # CUDA stops at the first invalid entry
    assert visible(gpus, "") == [] and visible(gpus, "-1") == []


def test_device_environment_prefers_the_uuid() -> None:
    (gpu,) = parse_gpus(ONE_GPU)
    assert device_environment(gpu) == {"CUDA_VISIBLE_DEVICES": gpu.uuid, "HOSTRUN_GPU": "0"}
    odd = gpu._replace(index=3, uuid="[N/A]")
    assert device_environment(odd) == {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                       "HOSTRUN_GPU": "3"}


def test_rooms_take_off_only_what_running_bookings_have_not_allocated() -> None:
    gpus = [Gpu(0, "GPU-a", "x", 16 * GiB, 6 * GiB, 10 * GiB), Gpu(1, "GPU-b", "x", 16 * GiB, 0, 16 * GiB),
            Gpu(2, "GPU-c", "x", None, None, None)]
    # Booked 8 GiB on GPU 0 and holding 6 GiB of it (two processes): 2 GiB still to come.
    apps = [GpuApp("GPU-a", 100, 4 * GiB), GpuApp("GPU-a", 101, 2 * GiB), GpuApp("GPU-b", 100, GiB)]
    assert gpu_rooms(gpus, [(0, 8 * GiB, [100, 101])], apps) == {0: 8 * GiB, 1: 16 * GiB}
    # Its processes unknown (another pid namespace, no cgroup): the whole booking comes off.
    assert gpu_rooms(gpus, [(0, 8 * GiB, [])], apps) == {0: 2 * GiB, 1: 16 * GiB}
    # Usage on another device does not count for this one; more than booked takes nothing extra off.
    assert gpu_rooms(gpus, [(1, 4 * GiB, [100])], apps)[1] == 13 * GiB
    assert gpu_rooms(gpus, [(0, 2 * GiB, [100, 101])], apps)[0] == 10 * GiB


def test_choose_gpu_most_room_and_fifo() -> None:
    assert choose_gpu({0: 2 * GiB, 1: 12 * GiB, 2: 6 * GiB}, [], 4 * GiB) == (1, 12 * GiB, 0, True)
    assert choose_gpu({0: 6 * GiB, 1: 6 * GiB}, [], 4 * GiB)[0] == 0  # a tie: the lowest index
    # An earlier waiter (10 GiB) is set against GPU 1, so 4 GiB goes to GPU 2 instead...
    assert choose_gpu({0: 2 * GiB, 1: 12 * GiB, 2: 6 * GiB}, [10 * GiB], 4 * GiB) == (2, 12 * GiB,
                                                                                     10 * GiB, True)
    # ...and where that leaves no device with room, the later job waits (reporting the best one).
    assert choose_gpu({0: 2 * GiB, 1: 12 * GiB}, [10 * GiB], 4 * GiB) == (1, 12 * GiB, 10 * GiB, False)
    assert choose_gpu({}, [], GiB) == (None, None, 0, False)


@pytest.mark.parametrize("pattern", [*OUTPUT_PATTERNS, *KERNEL_PATTERNS])
def test_scanner_finds_a_pattern_split_anywhere(pattern: bytes) -> None:
    text = b"\x00\xffnoise " * 100 + pattern + b" more"
    end = text.index(pattern) + len(pattern)
    for cut in range(end - len(pattern) - 2, end + 3):
        scanner = PatternScanner([pattern, b"a much longer other pattern"])
        assert scanner.feed(text[:cut]) == (pattern if cut >= end else None)
        assert scanner.feed(text[cut:]) == pattern
    one_byte_at_a_time = PatternScanner([pattern])
    found_at = next(i for i in range(len(text)) if one_byte_at_a_time.feed(text[i:i + 1]))
    assert found_at == end - 1


def test_scanner_keeps_only_a_short_tail() -> None:
    scanner = PatternScanner([b"CUDA out of memory", b"RESOURCE_EXHAUSTED"])
    for _ in range(100):
        assert scanner.feed(os.urandom(1 << 16).replace(b"C", b"c").replace(b"R", b"r")) is None
        assert len(scanner.tail) == len(b"RESOURCE_EXHAUSTED") - 1


@pytest.fixture
def fake(tmp_path: Path) -> FakeGpus:
    return FakeGpus(tmp_path)


def result(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def gpu_bookings(h: Hostrun) -> list[tuple[object, ...]]:
    con = sqlite3.connect(h.state_dir / "ledger.sqlite3", timeout=30)
    try:
        return con.execute("SELECT label, state, gpu_index, gpu_bytes, reason FROM bookings").fetchall()
    finally:
        con.close()


def test_read_gpus_runs_the_documented_query(fake: FakeGpus, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.set((16384, 0, 16384))
    monkeypatch.setenv("PATH", fake.env()["PATH"])
    assert [g.free for g in read_gpus()] == [16 * GiB]
    assert (fake.bin / "calls").read_text().split() == list(QUERY_GPUS)
    assert QUERY_GPUS == ("--query-gpu=index,uuid,name,memory.total,memory.used,memory.free",
                          "--format=csv,noheader,nounits")
    assert QUERY_APPS[0] == "--query-compute-apps=gpu_uuid,pid,used_memory"


def test_read_gpus_without_nvidia_smi_is_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert read_gpus() == []


def test_read_gpus_failing_or_hanging_says_why(fake: FakeGpus, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", fake.env()["PATH"])
    (fake.bin / "fail").write_text("NVIDIA-SMI has failed because it couldn't communicate with the "
                                   "NVIDIA driver.\n")
    with pytest.raises(GpuError, match=r"nvidia-smi failed \(exit 9\): NVIDIA-SMI has failed because"):
        read_gpus()
    (fake.bin / "fail").unlink()
    (fake.bin / "hang").touch()
    started = time.monotonic()
    with pytest.raises(GpuError, match=r"did not answer within 0\.5 s"):
        read_gpus(timeout=0.5)
    assert time.monotonic() - started < 3


def test_snapshot_is_rate_limited_and_survives_a_failing_apps_query(
        fake: FakeGpus, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.set((16384, 0, 16384), (16384, 0, 16384))
    fake.apps_file.write_text(f"{fake.uuid(1)}, 4242, 2048\n")
    monkeypatch.setenv("PATH", fake.env()["PATH"])
    snap = GpuSnapshot(GiB, parse_gpus(fake.gpus_file.read_text())[1:], max_age=0.2)  # GPU 1 only
    snap.refresh(lambda: True)
    assert snap.apps == [GpuApp(fake.uuid(1), 4242, 2 * GiB)]
    fake.set((16384, 0, 16384), (16384, 8192, 8192))
    snap.refresh(lambda: True)  # younger than max_age: nvidia-smi is not asked again
    assert [g.free for g in snap.gpus] == [16 * GiB]
    time.sleep(0.25)
    (fake.bin / "apps-fail").touch()
    snap.refresh(lambda: True)
    assert [(g.index, g.free) for g in snap.gpus] == [(1, 8 * GiB)] and snap.error is None
    assert snap.apps == []  # no per-process figures: bookings count whole (room underestimated)
    time.sleep(0.25)
    (fake.bin / "fail").write_text("Unable to determine the device handle for GPU0000:41:00.0: "
                                   "Unknown Error\n")
    snap.refresh(lambda: False)
    assert snap.gpus == [] and snap.error is not None and "Unknown Error" in snap.error
    calls = (fake.bin / "calls").read_text().splitlines()
    # The preflight's figures count as fresh: the first two refreshes read only the per-process usage.
    assert sum(c.startswith("--query-gpu=") for c in calls) == 2


# ------------------------------------------------------------------------------------- kernel log
def test_kernel_log_file_counts_only_lines_appended_after_the_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[ 10.0] NVRM: old failure NV_ERR_NO_MEMORY\n")
    reader = KernelLog({KERNEL_LOG_ENV: str(log)})
    reader.scan()
    assert reader.evidence is None and reader.error is None
    with log.open("a") as fh:
        fh.write("[ 20.0] NVRM: nvAssertFailedNoLog: NV_ERR_NO")
    reader.scan()
    assert reader.evidence is None
    with log.open("a") as fh:
        fh.write("_MEMORY (0x51)\n")
    reader.scan()
    assert reader.evidence is not None and "NV_ERR_NO_MEMORY" in reader.evidence
    reader.close()


def test_kernel_log_that_cannot_be_opened_says_why(tmp_path: Path) -> None:
    reader = KernelLog({KERNEL_LOG_ENV: str(tmp_path / "missing")})
    reader.scan()
    assert reader.evidence is None
    assert reader.error is not None and "cannot read the kernel log" in reader.error


def test_dev_kmsg_reader_sees_only_new_records() -> None:
    """The real /dev/kmsg: a marker written before the reader opens is not seen, one after is.

    The marker is harmless text, never NV_ERR_NO_MEMORY, so no other hostrun on this machine could
    take it for a driver failure. Writing /dev/kmsg needs root, as the whole suite does here.
    """
    marker = f"hostrun-test-{uuid.uuid4().hex}".encode()
    with open("/dev/kmsg", "wb", buffering=0) as kmsg:
        kmsg.write(b"before " + marker + b"\n")
        reader = KernelLog({})
        assert reader.is_kmsg and reader.error is None
        reader.scanner = PatternScanner([marker])
        reader.scan()
        assert reader.scanner.found is None
        kmsg.write(b"after " + marker + b"\n")
    wait_for(lambda: reader.scan() or reader.scanner.found == marker, timeout=5)
    reader.close()


# ---------------------------------------------------------------------------------- end to end
def test_booked_on_the_gpu_with_most_room(hostrun: Hostrun, fake: FakeGpus, tmp_path: Path) -> None:
    fake.set((16384, 14336, 2048), (16384, 4096, 12288), (16384, 10240, 6144))
    out = tmp_path / "r.json"
    proc = hostrun.run("-m", "64M", "--gpu-memory", "4G", "--result-file", str(out), "--",
                       "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $HOSTRUN_GPU"', env=fake.env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{fake.uuid(1)} 1\n"
    r = result(out)
    assert r["gpu_index"] == 1 and r["gpu_bytes"] == 4 * GiB and r["vram_evidence"] is None
    assert r["outcome"] == "exit"


def test_inherited_cuda_visible_devices_limits_the_choice(hostrun: Hostrun, fake: FakeGpus) -> None:
    fake.set((16384, 10240, 6144), (16384, 0, 16384))
    proc = hostrun.run("-m", "64M", "--gpu-memory", "4G", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES",
                       env=fake.env(CUDA_VISIBLE_DEVICES="0"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == fake.uuid(0)
    proc = hostrun.run("-m", "64M", "--gpu-memory", "4G", "--", "true",
                       env=fake.env(CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 78
    assert "CUDA_VISIBLE_DEVICES='' leaves none of this host's 2 GPU(s)" in proc.stderr


def test_second_job_waits_for_vram_and_starts_after_the_first(hostrun: Hostrun, fake: FakeGpus,
                                                             tmp_path: Path) -> None:
    """One 16 GiB GPU with 10 GiB free (6 GiB used outside hostrun): two 8 GiB jobs cannot share it."""
    fake.set((16384, 6144, 10240))
    marks, release = tmp_path / "marks", tmp_path / "release"
    env = fake.env()
    first = hostrun.popen("-m", "64M", "--label", "first", "--gpu-memory", "8G", "--", "sh", "-c",
                          f"echo first-start >> {marks}; while [ ! -e {release} ]; do sleep 0.05; done; "
                          f"echo first-end >> {marks}", env=env)
    wait_for(lambda: marks.exists() and "first-start" in marks.read_text())
    second = hostrun.popen("-m", "64M", "--label", "second", "--gpu-memory", "8G", "--", "sh", "-c",
                           f"echo second-start >> {marks}; echo $CUDA_VISIBLE_DEVICES", env=env)
    rows = wait_for(lambda: [r for r in gpu_bookings(hostrun) if r[0] == "second" and r[4]], timeout=15)
    assert rows[0][1:] == ("waiting", None, 8 * GiB, "vram: need 8.0 GiB, free 2.0 GiB on GPU 0")
    assert ("first", "running", 0, 8 * GiB, None) in gpu_bookings(hostrun)
    assert "second-start" not in marks.read_text()
    release.touch()
    first.wait(timeout=30)
    out, err = second.communicate(timeout=30)
    assert first.returncode == 0 and second.returncode == 0, err
    assert marks.read_text().split() == ["first-start", "first-end", "second-start"]
    assert out.strip() == fake.uuid(0)
    assert "waiting: 8.0 GiB VRAM needed, 2.0 GiB free on GPU 0; held by first (pid " in err
    assert ", 8.0 GiB VRAM on GPU 0, " in err


def test_vram_a_job_already_allocated_is_not_counted_twice(hostrun: Hostrun, fake: FakeGpus,
                                                          tmp_path: Path) -> None:
    """The first job books 6 GiB and (per the fake's per-process usage) allocates all of it: nvidia-smi
    then shows 10 GiB free, and an 8 GiB job fits beside it at once."""
    fake.set((16384, 0, 16384))
    started, second_ran = tmp_path / "started", tmp_path / "second-ran"
    env = fake.env()
    first = hostrun.popen("-m", "64M", "--label", "first", "--gpu-memory", "6G", "--", "sh", "-c",
                          f"printf '0, {fake.uuid(0)}, NVIDIA Fake GPU, 16384, 6144, 10240\\n' "
                          f"> {fake.gpus_file}; printf '{fake.uuid(0)}, %s, 6144\\n' $$ > {fake.apps_file}; "
                          f"touch {started}; i=0; while [ ! -e {second_ran} ] && [ $i -lt 400 ]; "
                          f"do sleep 0.05; i=$((i+1)); done; test -e {second_ran}", env=env)
    wait_for(started.exists)
    second = hostrun.run("-m", "64M", "--label", "second", "--gpu-memory", "8G", "--", "touch",
                         str(second_ran), env=env, timeout=30)
    first.wait(timeout=30)
    assert second.returncode == 0, second.stderr
    assert "waiting" not in second.stderr
    assert first.returncode == 0  # it saw the second job run while it still held its booking
    assert any(c.startswith("--query-compute-apps=") for c in (fake.bin / "calls").read_text().splitlines())


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("pattern", ["CUDA out of memory", "CUDA_ERROR_OUT_OF_MEMORY", "RESOURCE_EXHAUSTED"])
def test_oom_pattern_in_output_is_245(hostrun: Hostrun, fake: FakeGpus, tmp_path: Path, stream: str,
                                      pattern: str) -> None:
    fake.set((16384, 0, 16384))
    out = tmp_path / "r.json"
    redirect = ">&2" if stream == "stderr" else ""
    proc = hostrun.run("-m", "64M", "--gpu-memory", "1G", "--result-file", str(out), "--", "sh", "-c",
                       f"echo 'RuntimeError: {pattern}. Tried to allocate 2.00 GiB' {redirect}; exit 1",
                       env=fake.env())
    assert proc.returncode == 245, proc.stderr
    assert f"RuntimeError: {pattern}" in (proc.stdout if stream == "stdout" else proc.stderr)
    assert "exit 245 (vram): GPU memory shortage during the run" in proc.stderr
    r = result(out)
    assert r["outcome"] == "vram" and r["exit_code"] == 245
    assert r["vram_evidence"] == f"the job's {stream} shows {pattern!r}"


def test_kernel_log_nv_err_no_memory_during_the_run_is_245(hostrun: Hostrun, fake: FakeGpus,
                                                           tmp_path: Path) -> None:
    fake.set((16384, 0, 16384))
    out = tmp_path / "r.json"
    proc = hostrun.run("-m", "64M", "--gpu-memory", "1G", "--result-file", str(out), "--", "sh", "-c",
                       f"echo '[ 99.1] NVRM: rmapiAllocWithSecInfo: NV_ERR_NO_MEMORY' >> {fake.kernel_log}; "
                       "sleep 0.2; kill -ABRT $$", env=fake.env())
    assert proc.returncode == 245, proc.stderr
    r = result(out)
    assert r["outcome"] == "vram"
    assert r["vram_evidence"] == (f"the kernel log ({fake.kernel_log}) shows 'NV_ERR_NO_MEMORY' "
                                  "during the run")


def test_kernel_log_lines_from_before_the_run_do_not_count(hostrun: Hostrun, fake: FakeGpus) -> None:
    fake.set((16384, 0, 16384))
    with fake.kernel_log.open("a") as fh:
        fh.write("[ 50.0] NVRM: an earlier job's NV_ERR_NO_MEMORY\n")
    proc = hostrun.run("-m", "64M", "--gpu-memory", "1G", "--", "sh", "-c", "exit 3", env=fake.env())
    assert proc.returncode == 3, proc.stderr


@pytest.mark.parametrize("where", ["output", "kernel log"])
def test_exit_0_despite_a_gpu_oom_passes_0_with_a_warning(hostrun: Hostrun, fake: FakeGpus, tmp_path: Path,
                                                         where: str) -> None:
    fake.set((16384, 0, 16384))
    out = tmp_path / "r.json"
    action = ("echo 'retrying after CUDA out of memory'" if where == "output"
              else f"echo 'NVRM: NV_ERR_NO_MEMORY' >> {fake.kernel_log}")
    proc = hostrun.run("-m", "64M", "--gpu-memory", "1G", "--result-file", str(out), "--", "sh", "-c",
                       f"{action}; exit 0", env=fake.env())
    assert proc.returncode == 0, proc.stderr
    assert "(a GPU out-of-memory), but the job exited 0; passing 0 through" in proc.stderr
    r = result(out)
    assert r["outcome"] == "exit" and r["exit_code"] == 0 and r["vram_evidence"]


def test_without_nvidia_smi_gpu_memory_is_78_and_books_nothing(hostrun: Hostrun, tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    true = shutil.which("true")
    assert true is not None
    out = tmp_path / "r.json"
    env = {**os.environ, "PATH": str(empty)}
    proc = hostrun.run("-m", "64M", "--gpu-memory", "1G", "--result-file", str(out), "--", true, env=env)
    assert proc.returncode == 78
    assert proc.stderr.strip().splitlines() == [
        "hostrun: error: --gpu-memory needs a GPU, but nvidia-smi is not on PATH; nothing ran"]
    assert result(out)["outcome"] == "not-run"
    assert hostrun.bookings() == [] and hostrun.job_dirs() == []
    # Without --gpu-memory the same job runs: nvidia-smi is needed only when VRAM is asked for.
    assert hostrun.run("-m", "64M", "--", true, env=env).returncode == 0


def test_no_gpu_or_failing_nvidia_smi_is_78(hostrun: Hostrun, fake: FakeGpus) -> None:
    fake.gpus_file.write_text("")
    proc = hostrun.run("-m", "64M", "--gpu-memory", "1G", "--", "true", env=fake.env())
    assert proc.returncode == 78
    assert "needs a GPU, but nvidia-smi lists no GPU" in proc.stderr
    (fake.bin / "fail").write_text("NVIDIA-SMI has failed because it couldn't communicate with the "
                                   "NVIDIA driver.\n")
    proc = hostrun.run("-m", "64M", "--gpu-memory", "1G", "--", "true", env=fake.env())
    assert proc.returncode == 78
    assert "nvidia-smi failed (exit 9): NVIDIA-SMI has failed" in proc.stderr
    (fake.bin / "fail").unlink()
    fake.gpus_file.write_text(NOT_REPORTED)
    proc = hostrun.run("-m", "64M", "--gpu-memory", "1G", "--", "true", env=fake.env())
    assert proc.returncode == 78
    assert "no GPU here reports its memory" in proc.stderr
    assert hostrun.bookings() == []


def test_larger_than_every_gpu_is_243_at_once(hostrun: Hostrun, fake: FakeGpus) -> None:
    fake.set((16384, 0, 16384), (24576, 20000, 4576))
    proc = hostrun.run("-m", "64M", "--gpu-memory", "32G", "--", "true", env=fake.env())
    assert proc.returncode == 243
    assert ("--gpu-memory 32.0 GiB is larger than any GPU here (largest: GPU 1, 24.0 GiB); it could "
            "never be admitted") in proc.stderr
    assert hostrun.bookings() == []


def test_output_is_forwarded_intact_and_separately(hostrun: Hostrun, fake: FakeGpus,
                                                   tmp_path: Path) -> None:
    """Several MiB of every byte value, in uneven interleaved writes to both streams: each arrives
    byte for byte on its own stream."""
    fake.set((16384, 0, 16384))
    blobs = {1: os.urandom(3 << 20) + bytes(range(256)) * 64, 2: os.urandom(1 << 20) + b"\r\n\x00"}
    for fd, blob in blobs.items():
        (tmp_path / f"blob{fd}").write_bytes(blob)
    code = (
        "import os, random, sys\n"
        "r = random.Random(7)\n"
        "blob = lambda fd: open(os.path.join(sys.argv[1], f'blob{fd}'), 'rb').read()\n"
        "left = {fd: memoryview(blob(fd)) for fd in (1, 2)}\n"
        "while any(left.values()):\n"
        "    fd = r.choice([fd for fd in left if left[fd]])\n"
        "    k = os.write(fd, left[fd][:r.choice((1, 100, 4096, 70000, 300000))])\n"
        "    left[fd] = left[fd][k:]\n"
    )
    proc = subprocess.run(hostrun.argv("-m", "200M", "--gpu-memory", "1G", "--", PY, "-c", code,
                                       str(tmp_path)),
                          capture_output=True, env=fake.env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == blobs[1]
    assert proc.stderr == blobs[2]


def test_a_pattern_split_across_two_writes_is_found(hostrun: Hostrun, fake: FakeGpus) -> None:
    fake.set((16384, 0, 16384))
    code = ("import sys, time\n"
            "sys.stderr.write('torch.OutOfMemoryError: CUDA out of me'); sys.stderr.flush()\n"
            "time.sleep(0.3)\n"
            "sys.stderr.write('mory. Tried to allocate 20.00 MiB\\n'); sys.stderr.flush()\n"
            "sys.exit(1)\n")
    proc = hostrun.run("-m", "64M", "--gpu-memory", "1G", "--", PY, "-c", code, env=fake.env())
    assert proc.returncode == 245, proc.stderr
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n" in proc.stderr


def test_ordinary_jobs_are_not_teed_nor_judged_245(hostrun: Hostrun, fake: FakeGpus, tmp_path: Path) -> None:
    fake.set((16384, 0, 16384))
    show = "readlink /proc/self/fd/1; echo 'CUDA out of memory' >&2; exit 1"
    plain_out = tmp_path / "plain.txt"
    with plain_out.open("w") as fh:
        proc = hostrun.run("-m", "64M", "--", "sh", "-c", show, env=fake.env(), stdout=fh,
                           capture_output=False, stderr=subprocess.PIPE)
    assert proc.returncode == 1  # its own status: no GPU asked for, no 245
    assert plain_out.read_text().strip() == str(plain_out)  # the job wrote straight to our file
    gpu_out = tmp_path / "gpu.txt"
    with gpu_out.open("w") as fh:
        proc = hostrun.run("-m", "64M", "--gpu-memory", "1G", "--", "sh", "-c", show, env=fake.env(),
                           stdout=fh, capture_output=False, stderr=subprocess.PIPE)
    assert proc.returncode == 245
    assert gpu_out.read_text().startswith("pipe:[")  # teed through hostrun


def test_a_stalled_reader_does_not_stop_max_runtime(hostrun: Hostrun, fake: FakeGpus, tmp_path: Path) -> None:
    """hostrun's stdout is a pipe nobody reads for 4 s; the job floods it. The job is still stopped at
    its max runtime (hostrun never blocks on the reader), and once read, hostrun ends with 253."""
    fake.set((16384, 0, 16384))
    out = tmp_path / "r.json"
    proc = hostrun.popen("-m", "64M", "--gpu-memory", "1G", "--max-runtime", "1s", "--result-file", str(out),
                         "--", "sh", "-c", "yes flood", env=fake.env())
    time.sleep(4)
    _, err = proc.communicate(timeout=30)  # read at last: hostrun forwards the rest, then exits
    assert proc.returncode == 253, err
    assert "max runtime reached" in err
    assert result(out)["duration_s"] < 3.5  # type: ignore[operator]


def test_when_our_reader_goes_away_the_job_gets_sigpipe(hostrun: Hostrun, fake: FakeGpus) -> None:
    """``hostrun --gpu-memory … -- yes | head -c 10``: as if ``yes`` wrote to head directly, it dies of
    SIGPIPE (141) instead of running on with nobody reading."""
    fake.set((16384, 0, 16384))
    proc = hostrun.popen("-m", "64M", "--gpu-memory", "1G", "--", "yes", env=fake.env())
    assert proc.stdout is not None
    head = subprocess.run(["head", "-c", "10"], stdin=proc.stdout, capture_output=True, timeout=30,
                          check=False)
    proc.stdout.close()
    _, err = proc.communicate(timeout=30)
    assert head.stdout == b"y\ny\ny\ny\ny\n"
    assert proc.returncode == 128 + 13, err


def test_ledger_shows_the_gpu_booking(hostrun: Hostrun, fake: FakeGpus, tmp_path: Path) -> None:
    fake.set((16384, 0, 16384), (16384, 0, 16384))
    ledger_json = tmp_path / "ledger.json"
    hostrun_cmd = " ".join(hostrun.argv("ledger", "--json"))
    proc = hostrun.run("-m", "200M", "--label", "gpujob", "--gpu-memory", "3G", "--", "sh", "-c",
                       f"{hostrun_cmd} > {ledger_json}", env=fake.env())
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(ledger_json.read_text())["running"]
    assert row["label"] == "gpujob" and row["gpu_index"] == 0 and row["gpu_bytes"] == 3 * GiB


# ------------------------------------------------------------------------------------------- ledger
V1_SCHEMA = """
CREATE TABLE bookings (
    id INTEGER PRIMARY KEY AUTOINCREMENT, host TEXT NOT NULL, label TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('waiting', 'running')), pid INTEGER NOT NULL,
    pid_start INTEGER NOT NULL, size INTEGER NOT NULL, cap INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('cap', 'peak', 'gamble')), cgroup TEXT, command TEXT NOT NULL,
    session TEXT, queued REAL NOT NULL, since REAL, reason TEXT
);
CREATE INDEX bookings_host_state ON bookings (host, state, id);
CREATE TABLE peaks (
    label TEXT NOT NULL, host TEXT NOT NULL, max_peak INTEGER NOT NULL, runs INTEGER NOT NULL,
    last_peak INTEGER NOT NULL, hit_ceiling INTEGER NOT NULL, last_duration REAL, max_duration REAL,
    updated REAL NOT NULL, PRIMARY KEY (label, host)
);
INSERT INTO bookings (host, label, state, pid, pid_start, size, cap, kind, command, queued)
    VALUES ('local', 'old-job', 'waiting', 1, 1, 1048576, 1048576, 'cap', 'true', 0);
INSERT INTO peaks VALUES ('old-job', 'local', 5, 1, 5, 0, 1.0, 1.0, 0);
PRAGMA user_version = 1;
"""


def test_a_version_1_ledger_is_migrated_in_place(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    con = sqlite3.connect(state / "ledger.sqlite3")
    con.executescript(V1_SCHEMA)
    con.close()
    ledger = Ledger(str(state))
    try:
        assert ledger.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 2
        (old,) = ledger.bookings()
        assert old.label == "old-job" and old.gpu_index is None and old.gpu_bytes is None
        peak = ledger.peak("old-job", "local")
        assert peak is not None and peak.max_peak == 5
        me = os.getpid()
        new = ledger.enqueue(NewBooking(host="local", label="gpu", pid=me, pid_start=start_time(me) or 0,
                                        size=MiB,
                                        cap=MiB, kind="cap", command="x", session=None, gpu_bytes=2 * GiB))
        assert ledger.booking(new) == ledger.bookings()[-1]
        assert ledger.bookings()[-1].gpu_bytes == 2 * GiB
    finally:
        ledger.close()
    Ledger(str(state)).close()  # opening again changes nothing


def test_try_admit_records_the_chosen_gpu_in_the_same_transaction(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "state"))
    me = os.getpid()
    mine = start_time(me) or 0

    def book(label: str, gpu: int | None) -> int:
        return ledger.enqueue(NewBooking(host="local", label=label, pid=me, pid_start=mine, size=MiB, cap=MiB,
                              kind="cap", command=label, session=None, gpu_bytes=gpu))

    def room(running: list[Booking]) -> Room:
        return Room(GiB - sum(b.size for b in running))

    def gpu_room(running: list[Booking]) -> dict[int, int]:
        rooms = {0: 4 * GiB, 1: 10 * GiB}
        for b in running:
            if b.gpu_index is not None and b.gpu_bytes:
                rooms[b.gpu_index] -= b.gpu_bytes
        return rooms

    try:
        a, b, c = book("a", 8 * GiB), book("b", 8 * GiB), book("c", None)
        adm = ledger.try_admit(a, "local", room, gpu_room)
        assert adm.admitted and adm.gpu_device == 1
        booked = ledger.booking(a)
        assert booked is not None and booked.state == "running" and booked.gpu_index == 1
        adm = ledger.try_admit(b, "local", room, gpu_room)
        assert not adm.admitted and adm.memory_ok and not adm.gpu_ok
        assert (adm.gpu_device, adm.gpu_free) == (0, 4 * GiB)
        # A job without --gpu-memory behind it is not held up by the VRAM it does not need.
        assert ledger.try_admit(c, "local", room, gpu_room).admitted
        waiting = ledger.booking(b)
        assert waiting is not None and waiting.state == "waiting" and waiting.gpu_index is None
    finally:
        ledger.close()


def test_status_line_and_reason_say_what_is_missing() -> None:
    def booking(label: str, size: int, gpu: int | None, vram: int | None) -> Booking:
        return Booking(id=1, host="local", label=label, state="running", pid=4121, pid_start=1, size=size,
                       cap=size, kind="cap", cgroup=None, command=label, session=None, queued=0.0,
                       since=100.0, reason=None, gpu_index=gpu, gpu_bytes=vram)

    cpu = booking("build", 200 * MiB, None, None)
    train = booking("train", 64 * MiB, 0, 8 * GiB)
    other = booking("eval", 64 * MiB, 1, 2 * GiB)
    memory_only = Admission(False, 400 * MiB, 224 * MiB, 0, 0, [cpu], [])
    assert status_line(memory_only, now=100.5) == (
        "waiting: 400 MiB needed, 224 MiB free; held by build (pid 4121, 200 MiB, 0.5 s)")
    assert wait_reason(memory_only) == "memory: need 400 MiB, free 224 MiB"
    vram_only = Admission(False, 64 * MiB, 200 * MiB, 0, 0, [cpu, train, other], [], gpu_need=8 * GiB,
                          gpu_device=0, gpu_free=2 * GiB, memory_ok=True, gpu_ok=False)
    assert status_line(vram_only, now=820.0) == (
        "waiting: 8.0 GiB VRAM needed, 2.0 GiB free on GPU 0; "
        "held by train (pid 4121, 64 MiB, 8.0 GiB VRAM on GPU 0, 12 min)")
    assert wait_reason(vram_only) == "vram: need 8.0 GiB, free 2.0 GiB on GPU 0"
    both = vram_only._replace(need=400 * MiB, free=100 * MiB, memory_ok=False, gpu_ahead=4 * GiB)
    assert status_line(both, now=100.5).startswith(
        "waiting: 400 MiB needed, 100 MiB free; 8.0 GiB VRAM needed, 2.0 GiB free on GPU 0, 4.0 GiB VRAM "
        "queued ahead; held by build (pid 4121, 200 MiB, 0.5 s), train (")
    assert wait_reason(both) == ("memory: need 400 MiB, free 100 MiB; "
                                 "vram: need 8.0 GiB, free 2.0 GiB on GPU 0")
    unreadable = vram_only._replace(gpu_device=None, gpu_free=None)
    error = "nvidia-smi did not answer within 5 s"
    assert status_line(unreadable, now=100.5, gpu_error=error) == (
        f"waiting: 8.0 GiB VRAM needed; cannot read the GPUs: {error}; "
        "held by train (pid 4121, 64 MiB, 8.0 GiB VRAM on GPU 0, 0.5 s), "
        "eval (pid 4121, 64 MiB, 2.0 GiB VRAM on GPU 1, 0.5 s)")
    assert wait_reason(unreadable, error) == f"vram: need 8.0 GiB, {error}"


# ------------------------------------------------------------- every job on a host with NVIDIA GPUs
def test_has_nvidia_gpus_reads_one_directory(fake: FakeGpus, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NVIDIA_PROC_ENV, str(fake.nvidia_proc))
    assert has_nvidia_gpus()
    monkeypatch.setenv(NVIDIA_PROC_ENV, str(fake.no_gpus))
    assert not has_nvidia_gpus()
    monkeypatch.setenv(NVIDIA_PROC_ENV, str(tmp_path / "no-driver"))
    assert not has_nvidia_gpus()


def opened_by_hostrun(listing: Path) -> str:
    """A shell step for the job: list what its parent (the hostrun process that forked it) holds open."""
    return f"for f in /proc/$PPID/fd/*; do readlink $f; done > {listing}"


def test_plain_job_on_a_gpu_host_failing_with_nv_err_no_memory_is_245(
        hostrun: Hostrun, fake: FakeGpus, tmp_path: Path) -> None:
    """No --gpu-memory: the kernel log is watched all the same, and its output is not teed."""
    out, fds, stdout = tmp_path / "r.json", tmp_path / "fds", tmp_path / "stdout.txt"
    with stdout.open("w") as fh:
        proc = hostrun.run("-m", "64M", "--result-file", str(out), "--", "sh", "-c",
                           f"readlink /proc/self/fd/1; {opened_by_hostrun(fds)}; "
                           f"echo '[ 99.1] NVRM: rmapiAllocWithSecInfo: NV_ERR_NO_MEMORY' "
                           f">> {fake.kernel_log}; exit 1",
                           env=fake.env(), stdout=fh, capture_output=False, stderr=subprocess.PIPE)
    evidence = f"the kernel log ({fake.kernel_log}) shows 'NV_ERR_NO_MEMORY' during the run"
    assert proc.returncode == 245, proc.stderr
    assert f"hostrun: GPU out of memory: {evidence}" in proc.stderr
    assert "exit 245 (vram): GPU memory shortage during the run" in proc.stderr
    assert stdout.read_text().strip() == str(stdout)  # not teed: the job wrote straight to our file
    assert str(fake.kernel_log) in fds.read_text().split()
    r = result(out)
    assert r["outcome"] == "vram" and r["exit_code"] == 245 and r["vram_evidence"] == evidence
    assert r["gpu_index"] is None and r["gpu_bytes"] is None
    assert not (fake.bin / "calls").exists()  # nvidia-smi is never run for a plain job


def test_plain_job_on_a_gpu_host_line_from_before_the_run_does_not_count(
        hostrun: Hostrun, fake: FakeGpus) -> None:
    with fake.kernel_log.open("a") as fh:
        fh.write("[ 50.0] NVRM: an earlier job's NV_ERR_NO_MEMORY\n")
    proc = hostrun.run("-m", "64M", "--", "sh", "-c", "exit 3", env=fake.env())
    assert proc.returncode == 3, proc.stderr
    assert "GPU" not in proc.stderr


def test_plain_job_on_a_gpu_host_exiting_0_passes_0_with_a_warning(
        hostrun: Hostrun, fake: FakeGpus, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = hostrun.run("-m", "64M", "--result-file", str(out), "--", "sh", "-c",
                       f"echo 'NVRM: NV_ERR_NO_MEMORY' >> {fake.kernel_log}; exit 0", env=fake.env())
    assert proc.returncode == 0, proc.stderr
    assert (f"hostrun: warning: the kernel log ({fake.kernel_log}) shows 'NV_ERR_NO_MEMORY' during the "
            "run (a GPU out-of-memory), but the job exited 0; passing 0 through") in proc.stderr
    r = result(out)
    assert r["outcome"] == "exit" and r["exit_code"] == 0 and r["vram_evidence"]


@pytest.mark.parametrize("driver", ["no GPU listed", "no driver"])
def test_without_gpus_the_kernel_log_is_never_opened(hostrun: Hostrun, fake: FakeGpus, tmp_path: Path,
                                                     driver: str) -> None:
    """The same failing job on a host without GPUs: its status passes through, and the hostrun process
    does not hold the kernel log open while the job runs (the job looks, as the 245 test's does)."""
    fds = tmp_path / "fds"
    no_gpus = str(fake.no_gpus) if driver == "no GPU listed" else str(tmp_path / "missing")
    proc = hostrun.run("-m", "64M", "--", "sh", "-c",
                       f"{opened_by_hostrun(fds)}; echo 'NVRM: NV_ERR_NO_MEMORY' >> {fake.kernel_log}; "
                       "exit 1", env=fake.env(**{NVIDIA_PROC_ENV: no_gpus}))
    assert proc.returncode == 1, proc.stderr
    assert "GPU" not in proc.stderr
    opened = fds.read_text().split()
    assert opened and str(fake.kernel_log) not in opened  # it did list hostrun's descriptors


def test_doctor_tells_once_that_the_kernel_log_cannot_be_watched(hostrun: Hostrun, fake: FakeGpus,
                                                                tmp_path: Path) -> None:
    """Where the log cannot be read a job says nothing (every job would); ``hostrun doctor`` says it."""
    missing = tmp_path / "unreadable-kmsg"
    unreadable = fake.env(**{KERNEL_LOG_ENV: str(missing)})
    data = json.loads(hostrun.run("doctor", "--json", env=unreadable).stdout)
    why = f"cannot read the kernel log {missing}: No such file or directory"
    assert data["gpu_kernel_log"] == {"ok": False, "detail": why}
    assert (f"this host has NVIDIA GPUs, but {why}: jobs are not watched for NV_ERR_NO_MEMORY (245 then "
            "comes only from a --gpu-memory job's output)") in data["problems"]
    proc = hostrun.run("-m", "64M", "--", "sh", "-c", "exit 1", env=unreadable)
    assert (proc.returncode, proc.stderr) == (1, "")  # nothing said per job
    data = json.loads(hostrun.run("doctor", "--json", env=fake.env()).stdout)
    assert data["gpu_kernel_log"] == {"ok": True, "detail": str(fake.kernel_log)}
    assert not [p for p in data["problems"] if "NVIDIA" in p]
    no_gpus = fake.env(**{NVIDIA_PROC_ENV: str(fake.no_gpus)})
    data = json.loads(hostrun.run("doctor", "--json", env=no_gpus).stdout)
    assert data["gpu_kernel_log"] is None
