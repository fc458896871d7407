"""What a label's record on this host decides before a run here: the long-job rule that
``--long-job-rule`` applies (rule 0 of the dispatcher, which a plain run does not apply), and the VRAM
that ``--gpu-memory auto`` books.

The agent hooks and the PATH shims add both to the commands they route, so an agent's run gets the
same refusals and the same GPU booking as a person's ``--auto``: a job recorded (or declared) longer
than ``long_job_threshold`` exits 244 unless declared long, and a GPU command books what its label
used before. Only this host's ledger is read (one query; no peer is asked: the run happens here).
"""

from __future__ import annotations

from dispatch.core.settings import Settings
from dispatch.core.units import MiB, format_size
from dispatch.local.store.ledgerdb import PeakRecord
from dispatch.placement.longrule import long_job_rule

MYPY = False
if MYPY:
    from dispatch.hosts.judgement import Job

VRAM_STEP = 256 * MiB


def vram_booking(max_vram: int) -> int:
    """A quarter over the worst VRAM a run of the label used, rounded up to 256 MiB: VRAM is not
    capped, so the margin covers run-to-run variation, not a limit's headroom (RAM's half rule
    doubles, as a cap must never be the reason a job dies; nothing dies at a VRAM booking)."""
    want = max_vram + max_vram // 4
    return max(VRAM_STEP, -(-want // VRAM_STEP) * VRAM_STEP)


def record_here(settings: Settings, label: str) -> PeakRecord | None:
    """This host's record of ``label`` (None: never run here, or the ledger cannot be read: the
    rules then act as for a label with no history, and the run itself says what is wrong)."""
    from dispatch.core.errors import LedgerError
    from dispatch.local.admission.ledger import Ledger

    try:
        ledger = Ledger(settings.state_dir)
    except (LedgerError, OSError):
        return None
    try:
        return ledger.peak(label, settings.local.name)
    except LedgerError:
        return None
    finally:
        ledger.close()


def long_job_here(settings: Settings, job: Job, record: PeakRecord | None) -> list[str] | None:
    """``--long-job-rule``: the dispatcher's rule 0 over this host's record; the refusal's reasons,
    or None when the job may run."""
    reasons, refused = long_job_rule(settings, job, [(record, settings.local.name)])
    return reasons if refused else None


def gpu_memory_auto(settings: Settings, record: PeakRecord | None) -> tuple[int, str]:
    """``--gpu-memory auto``: the VRAM to book and why, from the label's recorded VRAM peak here,
    else ``default_gpu_memory``."""
    if record is not None and record.max_vram:
        size = vram_booking(record.max_vram)
        return size, (f"--gpu-memory auto: {format_size(size)} (its worst recorded VRAM "
                      f"{format_size(record.max_vram)} and a quarter)")
    size = settings.default_gpu_memory
    return size, (f"--gpu-memory auto: {format_size(size)} (default_gpu_memory: no VRAM recorded "
                  "for this label yet; this run records it)")
