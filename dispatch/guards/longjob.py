"""The long-job declaration: three answers that exempt a job from the long-job rule (exit 244).

A job expected to run longer than ``long_job_threshold`` on one host must say how it is sharded, how it
resumes after an interruption, and how it uses more than one machine. Each answer is one line of the
script's leading comment block (``# long-job: sharded: …``, ``# long-job: resumable: …``,
``# long-job: multi-host: …``) or one part of ``--long-job='sharded=…;resumable=…;multi-host=…'``
(``--long-job=@FILE`` reads the parts from FILE). A partial declaration does not exempt the job, and
244 names what it lacks, so the answer is written down rather than waved through.
"""

from __future__ import annotations

from collections.abc import Iterable

from dispatch.core.errors import UsageError

KEYS = ("sharded", "resumable", "multi-host")
MAX_FILE = 64 * 1024


def _split(part: str) -> tuple[str, str] | None:
    """``key=value`` or ``key: value`` (whichever separator comes first); None without either."""
    seps = [i for i in (part.find("="), part.find(":")) if i > 0]
    if not seps:
        return None
    i = min(seps)
    return part[:i].strip().lower(), part[i + 1:].strip()


def parse_spec(text: str, where: str = "--long-job") -> dict[str, str]:
    """The answers in a ``--long-job`` value (``;`` or newline between parts). An unknown key or an
    empty answer is a usage error: a typo must not quietly leave the job undeclared."""
    if text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read(MAX_FILE)
        except OSError as exc:
            raise UsageError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
        where = f"{where} file {path}"
        parts = text.splitlines()  # one answer a line: an answer may contain ';'
    else:
        parts = text.replace("\n", ";").split(";")
    answers: dict[str, str] = {}
    for raw in parts:
        part, comment = raw.strip(), raw.strip().startswith("#")
        if comment:  # a file may hold the script's own header lines; other comments are skipped
            part = part.lstrip("#").strip()
            if not part.lower().startswith("long-job:"):
                continue
        if part.lower().startswith("long-job:"):
            part = part[len("long-job:"):].strip()
        if not part:
            continue
        pair = _split(part)
        if pair is None or pair[0] not in KEYS:
            raise UsageError(f"{where}: {part!r} is not one of {', '.join(k + '=HOW' for k in KEYS)}")
        if not pair[1]:
            raise UsageError(f"{where}: {pair[0]} has no answer (say how)")
        answers[pair[0]] = pair[1]
    return answers


def from_headers(values: Iterable[str]) -> dict[str, str]:
    """The answers in a script's ``# long-job:`` lines (the values after ``long-job:``); a line
    that names none of the three keys answers nothing."""
    answers: dict[str, str] = {}
    for value in values:
        pair = _split(value)
        if pair is not None and pair[0] in KEYS and pair[1]:
            answers[pair[0]] = pair[1]
    return answers


def missing(answers: Iterable[str]) -> list[str]:
    """The keys of the declaration that ``answers`` (the keys given) lacks, in order."""
    given = set(answers)
    return [key for key in KEYS if key not in given]
