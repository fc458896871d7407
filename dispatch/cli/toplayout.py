"""How a frame of ``hostrun top`` (``dispatch.placement.topframe.TopFrame``) fits a terminal: lines of
styled spans (``dispatch.core.view``), none wider than the terminal and no more of them than its
height. A narrow terminal loses columns, a short one rows and then sections, never by wrapping:
each row is one line, long text cut with an ellipsis. Plain text, so ``--once`` prints the same
lines and tests check them without a terminal; ``dispatch.cli.render`` only colours them."""

from __future__ import annotations

import time
import unicodedata

from dispatch.core import Line, NamedTuple, Span, format_duration, format_size, view

MYPY = False
if MYPY:
    from collections.abc import Sequence
    from typing import Optional

    from dispatch.core import Gauge
    from dispatch.placement import HostPanel, JobRow, TopFrame

HINTS = ("   s sort  / filter  h help  q quit", "   h help")  # the keys in the header, the most that fit
STALE = 5.0  # seconds: a panel older than this says when it was read
KEYS = (("q", "quit"), ("s", "sort the running jobs by the next column"),
        ("/", "filter by session or label: type, Enter applies, Esc clears"),
        ("h", "this help (again: back)"), ("Ctrl-C", "quit"))


def cells(text: str) -> int:
    """How many terminal cells ``text`` takes (wide East Asian characters two, combining none)."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


def _take(text: str, room: int) -> str:
    """The longest start of ``text`` within ``room`` cells."""
    out = []
    for ch in text:
        room -= cells(ch)
        if room < 0:
            break
        out.append(ch)
    return "".join(out)


def cut(text: str, width: int, ellipsis: str = "…") -> str:
    """``text`` in at most ``width`` cells, its end replaced by ``ellipsis`` when it was longer."""
    if cells(text) <= width:
        return text
    if width <= cells(ellipsis):
        return ellipsis[:max(0, width)]
    return _take(text, width - cells(ellipsis)) + ellipsis


def fitted(spans: Sequence[Span], width: int, ellipsis: str = "…") -> Line:
    """One line of ``spans``, cut at ``width`` cells with ``ellipsis`` when longer."""
    if sum(cells(s.text) for s in spans) <= width:
        return Line(tuple(spans))
    if width <= cells(ellipsis):
        return Line((Span(ellipsis[:max(0, width)]),))
    limit, used, out = width - cells(ellipsis), 0, []
    for span in spans:
        size = cells(span.text)
        if used + size > limit:
            out.append(Span(_take(span.text, limit - used) + ellipsis, span.style))
            break
        out.append(span)
        used += size
    return Line(tuple(out))


class Column(NamedTuple):
    title: str
    most: int  # its widest (the flex column: its least)
    keep: int  # the lower, the longer it stays when the terminal narrows
    right: bool = False
    flex: bool = False


def table(columns: Sequence[Column], rows: Sequence[Sequence[Span]], width: int,
          ellipsis: str) -> list[Line]:
    """A header line and one line per row, the columns that fit ``width`` (the flex column takes
    what the others leave), each cell cut to its column."""
    widths = [min(c.most, max([cells(c.title)] + [cells(r[i].text) for r in rows])) if not c.flex
              else c.most for i, c in enumerate(columns)]
    shown = list(range(len(columns)))

    def need() -> int:
        return sum(widths[i] for i in shown) + len(shown) - 1

    while len(shown) > 1 and need() > width:
        drop = max((i for i in shown if not columns[i].flex), key=lambda i: (columns[i].keep, i),
                   default=None)
        if drop is None:
            break
        shown.remove(drop)
    flex = next((i for i in shown if columns[i].flex), None)
    if flex is not None:
        natural = max([cells(columns[flex].title)] + [cells(r[flex].text) for r in rows])
        widths[flex] = max(widths[flex], min(natural, width - need() + widths[flex]))

    def line(values: Sequence[Span], style: str = "") -> Line:
        spans: list[Span] = []
        for n, i in enumerate(shown):
            text = cut(values[i].text, widths[i], ellipsis)
            pad = " " * (widths[i] - cells(text))
            text = pad + text if columns[i].right else text + (pad if n < len(shown) - 1 else "")
            spans += [Span(text, values[i].style or style), Span(" " if n < len(shown) - 1 else "")]
        return fitted(spans, width, ellipsis)

    return [line([Span(c.title) for c in columns], view.BOLD), *(line(r) for r in rows)]


def bar(gauge: Gauge, width: int) -> list[Span]:
    """``[###==....]``: used, then booked beyond it, then the rest, ``width`` cells in all."""
    inner = width - 2
    total = gauge.total or 1
    used = max(0, min(inner, round(inner * gauge.used / total)))
    booked = max(used, min(inner, round(inner * max(gauge.used, gauge.booked) / total)))
    share = max(gauge.used, gauge.booked) / total
    style = view.RED if share >= 0.9 else view.YELLOW if share >= 0.75 else view.GREEN
    return [Span("["), Span("#" * used, style), Span("=" * (booked - used), view.YELLOW),
            Span("." * (inner - booked), view.DIM), Span("]")]


def clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def ago(when: Optional[float], now: float) -> str:
    if when is None:
        return "never read"
    return f"last read {clock(when)}, {format_duration(now - when)} ago"


def host_lines(host: HostPanel, now: float, width: int, ellipsis: str) -> list[Line]:
    """A host's title line, then its gauges (a bar where there is room), or why it is unread."""
    if host.error is not None:
        return [fitted((Span(host.name, view.BOLD), Span(": "), Span("could not read", view.RED),
                        Span(f" ({ago(host.read_at, now)}): "), Span(host.error, view.RED)),
                       width, ellipsis)]
    stale = host.read_at is not None and now - host.read_at >= STALE
    lines = [fitted((Span(host.title, view.BOLD), Span(f" ({ago(host.read_at, now)})" if stale else "",
                                                       view.YELLOW)), width, ellipsis)]
    names = max([cells(g.name) for g in host.gauges] + [0])
    bars = width >= 60 and any(g.total for g in host.gauges)
    bar_width = max(10, min(32, (width - names - 4) // 6)) if bars else 0
    for gauge in host.gauges:
        spans = [Span(" " + gauge.name + " " * (names - cells(gauge.name)) + " ")]
        if bar_width:
            spans += bar(gauge, bar_width) if gauge.total else [Span(" " * bar_width)]
            spans.append(Span(" "))
        lines.append(fitted((*spans, Span(gauge.text)), width, ellipsis))
    return lines


def _percent(share: Optional[float]) -> Span:
    if share is None:
        return Span("-")
    style = view.RED if share >= 0.9 else view.YELLOW if share >= 0.75 else ""
    return Span(f"{share * 100:.0f}%", style)


def _jobs(jobs: Sequence[JobRow], width: int, ellipsis: str) -> list[Line]:
    """The running jobs' table; with an ``agent session`` column (kept before ``cap`` as the width
    narrows) when a job was started in one."""
    columns = [Column("host", 12, 3), Column("label", 16, 0, flex=True), Column("session", 14, 2),
               Column("booked", 9, 1, True), Column("use", 9, 1, True), Column("cap", 9, 4, True),
               Column("elapsed", 7, 2, True), Column("near cap", 8, 3, True)]
    rows = [view.row(j.host, j.label, j.session or "-", format_size(j.booked), format_size(j.in_use),
                     format_size(j.cap), format_duration(j.elapsed), _percent(j.near_cap)) for j in jobs]
    if any(j.in_session for j in jobs):
        columns.append(Column("agent session", 16, 1))
        rows = [(*row, Span(j.in_session or "-")) for row, j in zip(rows, jobs)]
    return table(columns, rows, width, ellipsis)


def sections(frame: TopFrame, width: int, ellipsis: str) -> list[tuple[Line, list[Line]]]:
    """Below the hosts: each section's title line and its lines (header and rows)."""
    def title(text: str, count: int, none: str) -> Line:
        return fitted((Span(f"{text} ({count})" if count else f"{text}: {none}", view.BOLD),),
                      width, ellipsis)

    jobs = _jobs(frame.jobs, width, ellipsis)
    sessions = table((Column("host", 12, 3), Column("label", 16, 0, flex=True), Column("jobs", 4, 1, True),
                      Column("booked", 9, 2, True), Column("use", 9, 1, True), Column("cap", 9, 1, True),
                      Column("elapsed", 7, 2, True), Column("near cap", 8, 3, True)),
                     [view.row(j.host, j.label, str(j.jobs), format_size(j.booked), format_size(j.in_use),
                               format_size(j.cap), format_duration(j.elapsed), _percent(j.near_cap))
                      for j in frame.sessions], width, ellipsis)
    queue = table((Column("host", 12, 3), Column("label", 20, 0), Column("session", 14, 2),
                   Column("need", 9, 1, True), Column("waited", 7, 1, True),
                   Column("why / held by", 12, 0, flex=True)),
                  [view.row(q.host, q.label, q.session or "-", format_size(q.need),
                            format_duration(q.waited), q.reason or "-") for q in frame.queue],
                  width, ellipsis)
    outcomes = table((Column("ended", 8, 2), Column("host", 12, 4), Column("label", 20, 0),
                      Column("session", 14, 3), Column("code", 4, 0, True), Column("outcome", 12, 1),
                      Column("meaning", 12, 1, flex=True), Column("peak", 9, 5, True),
                      Column("took", 7, 5, True)),
                     [view.row(clock(o.ended), o.host, o.label, o.session or "-",
                               Span(str(o.code), view.GREEN if o.code == 0 else view.RED), o.outcome,
                               o.meaning, format_size(o.peak), format_duration(o.duration))
                      for o in frame.outcomes], width, ellipsis)
    alerts = [fitted((Span(a),), width, ellipsis) for a in frame.alerts]
    found = [(title("agent sessions", len(frame.sessions), "none"), sessions)] if frame.sessions else []
    found += [(title("running", len(frame.jobs), "none"), jobs if frame.jobs else []),
             (title("queue", len(frame.queue), "empty"), queue if frame.queue else []),
             (title("last outcomes here", len(frame.outcomes), "none"), outcomes if frame.outcomes else []),
             (title(frame.alerts_title, len(frame.alerts), "none"), alerts)]
    if frame.notes:
        found.append((title("notes", len(frame.notes), "none"),
                      [fitted((Span(n, view.YELLOW),), width, ellipsis) for n in frame.notes]))
    return found


def header(frame: TopFrame, width: int, ellipsis: str, typing: Optional[str]) -> Line:
    """The time, the sort, the filter (``/text_`` while it is typed) and the keys, as many as fit."""
    shown = f"/{typing}_" if typing is not None else (frame.filter or "-")
    spans = (Span("hostrun top", view.BOLD), Span(f"  {clock(frame.time)}  sort: "),
             Span(frame.sort, view.BOLD), Span("  filter: "), Span(shown, view.BOLD))
    used = sum(cells(s.text) for s in spans)
    hints = next((h for h in HINTS if used + len(h) <= width), "")
    return fitted((*spans, Span(hints, view.DIM)), width, ellipsis)


def allot(needs: Sequence[int], room: int) -> list[int]:
    """Lines for each part, one at a time to each part that wants more, in order, while there is room."""
    given = [0] * len(needs)
    while room > 0 and any(g < n for g, n in zip(given, needs)):
        for i, wanted in enumerate(needs):
            if room > 0 and given[i] < wanted:
                given[i] += 1
                room -= 1
    return given


def share(hosts: Sequence[int], sections: Sequence[int], room: int) -> list[int]:
    """The hosts' panels first, up to half the room (more when the sections need less), then the
    sections, then what they left back to the hosts."""
    room = max(0, room)
    host_room = min(sum(hosts), max(room // 2, room - sum(sections)))
    given = allot(hosts, host_room)
    below = allot(sections, room - sum(given))
    given = allot(hosts, room - sum(below))
    return given + below


def layout(frame: TopFrame, width: int, height: Optional[int] = None, help_shown: bool = False,
           typing: Optional[str] = None, ellipsis: str = "…") -> list[Line]:
    """The frame as at most ``height`` lines (None: as many as it takes) of at most ``width`` cells:
    the header; each host's panel; running jobs, the queue, the last outcomes, alerts. Short of
    room, each part gets lines in turn, and a cut one ends in a count of what it could not show."""
    width = max(1, width)
    top = [header(frame, width, ellipsis, typing)]
    if help_shown:
        keys = [fitted((Span(f" {k:<7}", view.BOLD), Span(what)), width, ellipsis) for k, what in KEYS]
        parts = [(fitted((Span("keys", view.BOLD),), width, ellipsis), keys)]
    else:
        parts = [(lines[0], lines[1:]) for lines in
                 (host_lines(h, frame.time, width, ellipsis) for h in frame.hosts)]
        parts += sections(frame, width, ellipsis)
    needs = [1 + len(body) for _, body in parts]
    hosts = 0 if help_shown else len(frame.hosts)
    given = needs if height is None else share(needs[:hosts], needs[hosts:], height - len(top))
    out = top
    for n, ((title, body), lines) in enumerate(zip(parts, given)):
        if lines == 0:
            continue
        if lines >= len(body) + 1:
            out += [title, *body]
        else:  # a table's header alone says nothing: a table shows a row too, or just its title
            table = n >= hosts and not help_shown
            kept = body[:lines - 1] if lines >= 3 or not table else []
            note = f" - {len(body) - len(kept)} more lines: a taller terminal shows them"
            out += [fitted((*title.spans, Span(note, view.DIM)), width, ellipsis), *kept]
    return out


def plain(lines: Sequence[Line]) -> str:
    """The lines as text, one per line, no styles (``--once`` to a pipe)."""
    return "".join("".join(s.text for s in line.spans).rstrip() + "\n" for line in lines)
