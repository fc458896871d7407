"""Human output: the only module that imports rich. Programs use ``--json`` instead."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dispatch.core import Line, NamedTuple, Span, format_duration, format_size, printable
from dispatch.local import Booking, PeakRecord, RunRecord

if TYPE_CHECKING:
    from dispatch.cli.doctor import Diagnosis
    from dispatch.core import Block

# a line of text is never broken here: a terminal wraps it, a pipe gets it whole
console = Console(soft_wrap=True)


def _t(value: object) -> str:
    """Text that came from elsewhere (a label, a session, a peer's report, a path): control
    characters escaped, and no rich markup (``[red]`` in a label stays literal)."""
    return escape(printable(str(value)))


class Col(NamedTuple):
    """A column of a table that fits the terminal: ``drop`` orders which go first when the width is
    short (0: never); a ``flex`` column (a label, a command, a reason) gives up width first, cut
    with an ellipsis; the others keep their natural width (sizes, durations, ids are compact)."""

    name: str
    drop: int = 0
    flex: bool = False
    justify: str = "left"
    least: int = 0  # a flex column's narrowest (0: FLEX_MIN, or MAIN_MIN for one never dropped)


FLEX_MIN = 8  # a flex column is never narrower than this (or its header) ...
MAIN_MIN = 12  # ... nor one never dropped (what the row is about: a label, a reason)


def fitted(title: str, cols: Sequence[Col], rows: Sequence[Sequence[str]], tight: bool = False,
           wrap: bool = False) -> Table:
    """A table of one line per row within the console's width (``rows``: rich markup, already
    escaped): columns dropped in ``drop`` order while even their minimum widths do not fit, then the
    flex columns share what is left, each cut with an ellipsis (the full text stays in ``--json``).

    ``tight``: where all the columns do not fit with a space either side of each cell, the cells lose
    those spaces before any column is dropped (``history``: what a run peaked at, how long it took and
    how it ended are what the table is for). ``wrap``: the flex columns fold onto more lines instead
    of being cut (``doctor``'s reasons are what it is there to say)."""
    from rich.text import Text

    natural = [max([len(c.name)] + [Text.from_markup(r[i]).cell_len for r in rows])
               for i, c in enumerate(cols)]
    least = [min(n, max(len(c.name), c.least or (FLEX_MIN if c.drop else MAIN_MIN))) if c.flex else n
             for c, n in zip(cols, natural)]
    keep = list(range(len(cols)))
    width = console.width
    pad = 1

    def overhead(n: int) -> int:
        return (2 * pad + 1) * n + 1  # a border and ``pad`` spaces either side of each cell

    if tight and sum(least) + overhead(len(keep)) > width:
        pad = 0
    for i in sorted(keep, key=lambda i: -cols[i].drop):
        if sum(least[k] for k in keep) + overhead(len(keep)) <= width or cols[i].drop == 0:
            break
        keep.remove(i)
    slack = width - overhead(len(keep)) - sum(natural[k] for k in keep if not cols[k].flex)
    flex = [k for k in keep if cols[k].flex]
    widths = {k: natural[k] for k in flex}  # the others keep their natural width
    if flex and sum(natural[k] for k in flex) > slack:
        # each its least, then what is left shared by how much more each would take
        spare = max(0, slack - sum(least[k] for k in flex))
        more = sum(natural[k] - least[k] for k in flex) or 1
        for k in flex:
            widths[k] = least[k] + spare * (natural[k] - least[k]) // more
    heading = Text.from_markup(title, overflow="ellipsis")
    heading.no_wrap = True
    table = Table(title=heading if title else None, padding=(0, pad))
    for k in keep:
        c = cols[k]
        folds = wrap and c.flex
        table.add_column(c.name, justify=c.justify, no_wrap=not folds,  # type: ignore[arg-type]
                         overflow="fold" if folds else "ellipsis", max_width=widths.get(k))
    for r in rows:
        table.add_row(*(r[k] for k in keep))
    return table


def codes(rows: Sequence[tuple[int, str, str]]) -> None:
    console.print(fitted("hostrun exit codes (a job's own status passes through; signal N → 128+N)",
                         (Col("code", justify="right"), Col("name", 1), Col("meaning", 0, flex=True)),
                         [(str(code), name, meaning) for code, name, meaning in rows]))


QUEUE_SHOWN = 50  # a terminal's worth: a queue of thousands is a count, not a table (--json has all)


def ledger(bookings: Sequence[Booking], peaks: Sequence[PeakRecord],
           stale: frozenset[int] | set[int] = frozenset(),
           invalid: frozenset[int] | set[int] = frozenset(), clear_after: int = 3) -> None:
    from dispatch.local import mark_reasons

    now = time.time()
    running: list[tuple[str, ...]] = []
    queue: list[tuple[str, ...]] = []
    waiting = 0
    for b in bookings:
        if b.state != "running":
            waiting += 1
            if waiting > QUEUE_SHOWN:
                continue
        label = f"{_t(b.label)} [red](stale: holder gone)[/red]" if b.id in stale else _t(b.label)
        if b.id in invalid:  # nothing acts on its cgroup; see dispatch.capping.base.checked_job_path
            label += " [red](invalid: cgroup outside the slice)[/red]"
        if b.state == "running":
            running.append((str(b.id), _t(b.host), label, str(b.pid), _t(b.kind), format_size(b.size),
                            format_size(b.cap), format_duration(now - (b.since or now)),
                            _t(b.session or "")))
        else:
            queue.append((str(b.id), _t(b.host), label, str(b.pid), format_size(b.size),
                          format_duration(now - b.queued), _t(b.reason or "")))
    rows, marks = [], []
    for p in peaks:
        booking_peak = format_size(p.max_peak) if p.max_peak else "-"  # no run succeeded yet
        rows.append((_t(p.label), _t(p.host), booking_peak, format_size(p.last_peak),
                     str(p.runs), "yes" if p.hit_ceiling else "no", format_duration(p.last_duration)))
        reasons = mark_reasons(p, clear_after)
        if reasons:
            marks.append(f"{_t(p.label)} on {_t(p.host)}: booked at its cap: {'; '.join(reasons)}")
    console.print(fitted("running", (Col("id"), Col("host", 4), Col("label", 0, flex=True), Col("pid", 3),
                                     Col("kind", 5), Col("booked"), Col("cap", 2), Col("age", 1),
                                     Col("session", 6, flex=True)), running)
                  if running else "running: none")
    console.print(fitted("queue (FIFO)", (Col("id"), Col("host", 3), Col("label", 0, flex=True),
                                          Col("pid", 2), Col("need"), Col("waited", 1),
                                          Col("reason", 4, flex=True)), queue)
                  if queue else "queue: empty")
    if waiting > QUEUE_SHOWN:
        console.print(f"… and {waiting - QUEUE_SHOWN} more waiting ({waiting} in all; "
                      "'hostrun ledger --json' lists every one)")
    peak_cols = (Col("label", 0, flex=True), Col("host", 3), Col("max peak"), Col("last peak", 1),
                 Col("runs", 2), Col("hit ceiling", 4), Col("last duration", 5))
    console.print(fitted("peak table", peak_cols, rows) if rows else "peak table: empty")
    for line in marks:
        console.print(line)


def history(runs: Sequence[RunRecord]) -> None:
    """``hostrun history``: one row per finished run, oldest first. The end is the start plus the
    duration (``--json`` has both), which keeps the table within a terminal's width."""
    if not runs:
        console.print("history: no runs")
        return
    # Never left out: how long it took, how it ended, its peak (the README's promise), the label;
    # the command is cut instead. Left out first where even that is too wide: session, host, the
    # start, then cap and booked.
    cols = (Col("started", 3), Col("duration"), Col("host", 5), Col("label", 0, flex=True),
            Col("session", 6, flex=True), Col("exit"), Col("peak"), Col("cap", 2), Col("booked", 1),
            Col("command", 0, flex=True, least=FLEX_MIN))
    rows = []
    for r in runs:
        code = str(r.exit_code) if r.outcome in ("exit", "signal") \
            else f"{r.exit_code} {_t(r.outcome)}"
        peak = format_size(r.peak) + (" [red]ceiling[/red]" if r.hit_ceiling else "")
        booked = f"{format_size(r.booked)} {_t(r.kind)}" if r.kind else "-"
        rows.append((time.strftime("%m-%d %H:%M:%S", time.localtime(r.started)),
                     format_duration(r.duration), _t(r.host), _t(r.label), _t(r.session or ""),
                     code, peak, format_size(r.cap), booked, _t(r.command)))
    console.print(fitted("run history (oldest first)", cols, rows, tight=True))


def readings(items: Sequence[Any]) -> None:
    """Every host's report as its host describes it (``Host.describe``), or why it could not be read."""
    for reading in items:
        if reading.report is None:
            console.print(f"[bold]{_t(reading.host)}[/bold]: [red]could not read:[/red] "
                          f"{_t(reading.error)}")
        else:
            blocks(reading.source.describe(reading.report))


def _spans(spans: Sequence[Span]) -> str:
    return "".join(f"[{s.style}]{_t(s.text)}[/{s.style}]" if s.style else _t(s.text) for s in spans)


def blocks(items: Sequence[Block]) -> None:
    """Lines and tables (``dispatch.core.view``): every text escaped, styles as rich markup."""
    for block in items:
        if isinstance(block, Line):
            console.print(_spans(block.spans))
        elif not block.rows and block.empty is not None:
            console.print(_t(block.empty))
        else:  # the last column takes what is left (a value, a reason), cut to fit
            last = len(block.columns) - 1
            table = fitted(_t(block.title), [Col(c, 0, flex=i == last) for i, c in enumerate(block.columns)],
                           [[_spans((cell,)) for cell in row] for row in block.rows])
            table.show_header = block.header
            console.print(table)


def decision(d: Any) -> None:
    verdict = {"local": "run here (local)", "peer": f"run on {_t(d.host)}",
               "queue": f"wait in the queue on {_t(d.host)}", "refuse": f"refuse (exit {d.exit_code})"}
    console.print(f"[bold]decision:[/bold] {verdict[d.action]}")
    for reason in d.reasons:
        console.print(f"  - {_t(reason)}")
    if d.judgements:
        rows = [(_t(j.host), "yes" if j.fits else "no", format_size(j.need), format_size(j.free),
                 _t(j.reason)) for j in d.judgements]
        console.print(fitted("hosts", (Col("host"), Col("fits"), Col("need", 1), Col("free", 2),
                                       Col("why", 0, flex=True)), rows))


def doctor(data: Diagnosis) -> None:
    console.print(f"hostrun {data['version']} (python {data['python']})")
    console.print(f"config:   {_t(data['config'])}")
    console.print(f"ledger:   {_t(data['ledger'])}")
    engine = data.get("admission_engine") or {}
    console.print(f"engine:   {_t(engine.get('detail') or '-')}"
                  + (f" ({_t(engine['socket'])})" if engine.get("socket") else ""))
    console.print(f"backend:  [bold]{data['backend']}[/bold]"
                  + (f" (forced by config: {data['forced_backend']})" if data["forced_backend"] else ""))
    ram = format_size(data["memory_total"])
    if data["slice_limit"] is None:
        console.print(f"slice:    {_t(data['slice_from'])} on {ram} of RAM (see the problem below)")
    else:
        console.print(f"slice:    {_t(data['slice'] or '-')}, limit {format_size(data['slice_limit'])} "
                      f"of {ram} RAM ({_t(data['slice_from'])})")
    console.print(f"threads:  {data['heavy_threads']}")
    rows = [(p["backend"], "yes" if p["ok"] else "no", _t(p["detail"])) for p in data["probes"]]
    rows.append(("none", "yes", "always; only with --no-cap"))
    console.print(fitted("memory-cap backends, in order of preference",
                         (Col("backend"), Col("usable"), Col("detail", 0, flex=True)), rows, wrap=True))
    for problem in data["problems"]:
        console.print(f"[red]problem:[/red] {_t(problem)}")
    for entry in data.get("peers", []):  # each as its kind describes itself (Host.diagnose)
        state = "[green]ok[/green]" if entry["ok"] and not entry["problems"] else (
            "[yellow]warnings[/yellow]" if entry["ok"] else f"[red]{_t(entry['unread'])}[/red]")
        console.print(f"{_t(entry['title'])}: {state}{_t(entry['details'])}")
        for problem in entry["problems"]:
            console.print(f"  [red]problem:[/red] {_t(problem)}")


def capacity(hosts: Sequence[Any]) -> None:
    """``hostrun capacity``: per host, its own labels (figures of different hosts are never mixed)."""
    short = {"cap-below-half-rule": "low-cap", "half-rule-over-slice": "over-slice",
             "peaks-vary": "varies"}
    for h in hosts:
        if not h.ok:
            console.print(f"[bold]{_t(h.host)}[/bold]: [red]could not read:[/red] {_t(h.error)}")
            continue
        where = f"{_t(h.host)} ({_t(h.hostname)})" if h.hostname else _t(h.host)
        sessions = (f"{h.session_labels} session label{'s' if h.session_labels > 1 else ''}: "
                    "'hostrun capacity --sessions'") if h.session_labels else ""
        if not h.labels:
            empty = f"no job labels; {sessions}" if sessions else "peak table empty"
            console.print(f"[bold]{where}[/bold]: {empty} (slice {format_size(h.slice_limit)})")
            continue
        then = f" → {format_size(h.what_if)}" if h.what_if is not None else ""
        cols = (Col("label", 0, flex=True), Col("runs", 5), Col("worst / last peak", 2), Col("booked as", 1),
                Col(f"fits{then and ' now→what-if'}"), Col("cap", 3), Col("half-rule cap", 4),
                Col("fits at it", 6), Col("flags", 7, flex=True))
        rows = []
        for a in h.labels:
            fits, at_half = str(a.now.fits), str(a.now.fits_at_half_rule_cap)
            booked = f"{a.now.kind} {format_size(a.now.booked)}"
            if a.what_if is not None:
                fits += f" → {a.what_if.fits}"
                at_half += f" → {a.what_if.fits_at_half_rule_cap}"
                if (a.what_if.kind, a.what_if.booked) != (a.now.kind, a.now.booked):
                    booked += f" → {a.what_if.kind} {format_size(a.what_if.booked)}"
            if a.cap_source == "unknown":
                cap = "not recorded"
            else:
                cap = format_size(a.cap) if a.cap is not None else "none"
                cap += " (default)" if a.cap_source == "default-cap" else ""
            worst = format_size(a.max_peak) if a.max_peak else "-"  # no run of it succeeded yet
            rows.append((_t(a.label), str(a.runs), f"{worst} / {format_size(a.last_peak)}",
                         booked, fits, cap, format_size(a.half_rule_cap), at_half,
                         " ".join(short.get(f, f) for f in a.flags) or "-"))
        console.print(fitted(f"{where}, its own peak table; slice {format_size(h.slice_limit)}{then}",
                             cols, rows))
        for a in h.labels:
            for note in a.notes:
                console.print(f"  [yellow]{_t(a.label)}[/yellow] on {_t(h.host)}: {_t(note)}")
        if sessions:
            console.print(f"  and {sessions}")


def sessions(hosts: Sequence[Any]) -> None:
    """``hostrun capacity --sessions``: per host, its sessions slice, one row per session label and
    one for a session not yet run (the default cap), so the rule shows before any session ran."""
    short = {"cap-below-half-rule": "low-cap", "half-rule-over-slice": "over-slice",
             "peaks-vary": "varies"}
    for h in hosts:
        where = f"{_t(h.host)} ({_t(h.hostname)})" if h.hostname else _t(h.host)
        if not h.ok:
            console.print(f"[bold]{where}[/bold]: [red]could not read:[/red] {_t(h.error)}")
            continue
        if h.sessions is None:
            console.print(f"[bold]{where}[/bold]: {_t(h.no_sessions)}")
            continue
        then = f" → {format_size(h.what_if_limit)}" if h.what_if_limit is not None else ""
        running = (f"{h.running_sessions} running, {format_size(h.running_held)} at their caps"
                   if h.running_sessions else "none running")
        title = (f"{where}, sessions slice {format_size(h.sessions['limit'])}{then} "
                 f"(share {h.sessions['share']:g}); {running}")
        cols = (Col("session", 0, flex=True), Col("runs", 5), Col("worst / last peak", 2),
                Col("last cap", 4), Col("cap"), Col(f"fits{then and ' now→what-if'}"),
                Col("more now", 3), Col("flags", 6, flex=True))
        rows = [(_t(a.label), str(a.runs), _peaks(a), _last_cap(a),
                 format_size(a.fit.cap) + (" (default)" if a.fit.cap_source == "default" else ""),
                 _fits(a.fit), str(a.fit.fits_beside_running),
                 " ".join(short.get(f, f) for f in a.flags) or "-") for a in h.labels]
        d = h.default
        rows.append(("[dim](not run yet)[/dim]", "0", "-", "-", f"{format_size(d.cap)} (default)",
                     _fits(d), str(d.fits_beside_running), "-"))
        console.print(fitted(title, cols, rows))
        for note in h.notes:
            console.print(f"  [yellow]{_t(h.host)}[/yellow]: {_t(note)}")
        for a in h.labels:
            for note in a.notes:
                console.print(f"  [yellow]{_t(a.label)}[/yellow] on {_t(h.host)}: {_t(note)}")


def _peaks(a: Any) -> str:
    worst = format_size(a.max_peak) if a.max_peak else "-"  # no run of it succeeded yet
    return f"{worst} / {format_size(a.last_peak)}"


def _last_cap(a: Any) -> str:
    if not a.last_cap_known:
        return "not recorded"
    return format_size(a.last_cap) if a.last_cap is not None else "none"


def _fits(f: Any) -> str:
    return str(f.fits) + (f" → {f.what_if_fits}" if f.what_if_fits is not None else "")


def workdirs(data: dict[str, Any]) -> None:
    """``hostrun workdir list``: claimed directories under a root, with owner, age, size, open by."""
    import os

    root = data["root"]
    shown_root = _t(root)
    if not data["directories"]:
        console.print(f"no claimed directories under {shown_root}")
    else:
        rows = []
        for d in data["directories"]:
            size = format_size(d["size_bytes"])
            if not d["size_complete"]:
                size = f">= {size}"
            opened = ", ".join(f"pid {o['pid']} ({o['comm']}) {o['how']}" for o in d["open_by"]) or "-"
            session = _t(d["session"]) if d["session"] else "(unknown)"
            rows.append((_t(os.path.relpath(d["path"], root)), f"{session} (you)" if d["mine"] else session,
                         _t(d["purpose"]), format_duration(d["age_s"]), size, _t(opened)))
        cols = (Col("directory", 0, flex=True), Col("session", 2, flex=True), Col("purpose", 3, flex=True),
                Col("age", 1), Col("size", 4), Col("open by", 5, flex=True))
        console.print(fitted(f"claimed directories under {shown_root}", cols, rows))
    if data["hidden_processes"]:
        from dispatch.guards import hidden_note

        console.print(_t(hidden_note(data["hidden_processes"])))


# -- hostrun top: the lines dispatch.cli.toplayout fitted, coloured, on the alternate screen --

def _top_text(lines: Sequence[Line]) -> Any:
    """One rich ``Text`` of the lines: no markup is read (every text is already escaped), no wrap."""
    from rich.text import Text

    text = Text(no_wrap=True, overflow="crop", end="")
    for n, line in enumerate(lines):
        if n:
            text.append("\n")
        for span in line.spans:
            text.append(span.text, style=span.style or None)
    return text


def top_print(lines: Sequence[Line]) -> None:
    """``hostrun top --once`` on a terminal: the frame in colour, on the normal screen."""
    console.print(_top_text(lines), soft_wrap=True)


class TopScreen:
    """The alternate screen ``hostrun top`` draws on (rich's ``Live``, no refresh thread of its
    own): entered with ``with``, left with the cursor shown again whatever ended the view."""

    def __init__(self) -> None:
        from rich.live import Live

        self.console = Console()
        self.live = Live(console=self.console, screen=True, auto_refresh=False,
                         redirect_stdout=False, redirect_stderr=False)

    def __enter__(self) -> TopScreen:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def draw(self, lines: Sequence[Line], size: tuple[int, int]) -> None:
        """The lines, at the terminal's ``size`` (columns, rows) as read just now."""
        self.console.size = size
        self.live.update(_top_text(lines), refresh=True)
