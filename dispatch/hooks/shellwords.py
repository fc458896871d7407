"""A small shell-word parser: a command line (or a script's text) as the simple commands it runs.

Not a shell: no expansion is done, words keep ``$VAR`` and globs as written. What it gets right is
what the classifier needs to see every command a line runs: quotes and escapes, the list and pipe
operators (``;`` ``&`` ``&&`` ``||`` ``|`` ``|&``, newlines), subshells and groups (``( … )``,
``{ …; }``), comments, line continuations, redirections (their targets are not arguments), here-docs
and here-strings (kept with their command: ``bash <<EOF`` runs its body), and the command texts
inside ``$( … )``, backticks and ``<( … )``, returned for the caller to parse in turn.

Hand-written rather than ``shlex`` (which imports ``re`` and knows none of ``$( … )``, here-docs or
redirections); it never raises on malformed input (an unbalanced quote ends at the end of the text),
and it stops at ``deadline`` (a ``time.monotonic()`` value) checked once per line, saying so.
"""

from __future__ import annotations

import time

from dispatch.core.records import NamedTuple

OPERATOR_CHARS = ";&|()\n"
REDIRECT_CHARS = "<>"
BLANKS = " \t\r"
# a line with none of these is plain words: split at C speed (most lines of most scripts)
SPECIAL = frozenset("'\"\\$`<>;&|(){}#\n")
WORD_STOP = frozenset(BLANKS + OPERATOR_CHARS + REDIRECT_CHARS + "'\"\\$`#{}")


class Simple(NamedTuple):
    """One simple command: its words (quotes removed), the line it starts on (1-based), the command
    texts of its ``$( … )``/backtick/``<( … )`` substitutions, and its here-doc/here-string input."""

    words: list[str]
    line: int
    subs: list[str]
    stdin_text: str | None = None
    after_pipe: bool = False  # its stdin is the output of the command before it (``a | b``)
    writes: tuple[str, ...] = ()  # the files its output redirections write (``> f``, ``>> f``, ``&> f``)


class Parsed(NamedTuple):
    """Every simple command found, in order; ``stopped`` is True when the deadline cut it short."""

    commands: list[Simple]
    stopped: bool = False


def _matching(text: str, i: int, open_: str, close: str, depth: int = 1) -> int:
    """Index just past the ``close`` that balances the ``depth`` open ``open_`` before ``i`` (quotes
    respected); ``len(text)`` when there is none."""
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            j = text.find("'", i + 1)
            i = n if j < 0 else j + 1
            continue
        if c == '"':
            i = _end_of_double(text, i + 1)
            continue
        if c == "`":
            j = text.find("`", i + 1)
            i = n if j < 0 else j + 1
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b",
            "f": "\f", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"}


def _ansi_c(text: str, i: int) -> tuple[int, str]:
    """From just past ``$'``: (index past the closing quote, the decoded text), as bash reads it."""
    out: list[str] = []
    n = len(text)
    while i < n and text[i] != "'":
        c = text[i]
        if c != "\\" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[nxt]
            digits = ""
            j = i + 2
            while j < n and len(digits) < width and text[j] in "0123456789abcdefABCDEF":
                digits += text[j]
                j += 1
            out.append(chr(int(digits, 16)) if digits and int(digits, 16) < 0x110000 else text[i:j])
            i = j
        elif nxt in "01234567":
            j = i + 1
            while j < n and j < i + 4 and text[j] in "01234567":
                j += 1
            out.append(chr(int(text[i + 1 : j], 8) & 0xFF))
            i = j
        else:
            out.append(text[i : i + 2])
            i += 2
    return min(i + 1, n), "".join(out)


def _end_of_double(text: str, i: int) -> int:
    """Index just past the ``"`` closing a double-quoted string that starts at ``i``."""
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i + 1
        elif c == "$" and text.startswith("$(", i):
            i = _matching(text, i + 2, "(", ")")
        elif c == "`":
            j = text.find("`", i + 1)
            i = n if j < 0 else j + 1
        else:
            i += 1
    return n


class _Parser:
    """One pass over ``text``; ``commands`` fills as it goes (partial results survive a deadline)."""

    def __init__(self, text: str, deadline: float | None) -> None:
        self.text = text
        self.deadline = deadline
        self.commands: list[Simple] = []
        self.stopped = False
        self.line = 1
        self.words: list[str] = []
        self.subs: list[str] = []
        self.start_line = 1
        self.stdin_text: str | None = None
        self.after_pipe = False
        # [delimiter, strip leading tabs, index of the command it feeds (-1: none; None: not ended)],
        # the bodies are read at the next newline
        self.heredocs: list[list[object]] = []
        self.redirect_target = False  # the next word is a redirection's target, not an argument
        self.redirect_output = False  # ... and that redirection writes a file
        self.writes: list[str] = []
        self.heredoc_word = False  # ... and that target is a here-doc delimiter
        self.heredoc_strip = False  # <<- (leading tabs stripped from the body and the delimiter)
        self.herestring_word = False

    # ---------------------------------------------------------------- commands
    def end_command(self) -> None:
        owner = -1
        if self.words or self.subs or self.stdin_text is not None:
            self.commands.append(Simple(self.words, self.start_line, self.subs, self.stdin_text,
                                        self.after_pipe, tuple(self.writes)))
            owner = len(self.commands) - 1
        for heredoc in self.heredocs:
            if heredoc[2] is None:
                heredoc[2] = owner
        self.words, self.subs, self.stdin_text = [], [], None
        self.after_pipe = False
        self.writes = []

    def add_word(self, word: str) -> None:
        if self.heredoc_word:
            self.heredoc_word = False
            self.heredocs.append([word, self.heredoc_strip, None])
            return
        if self.herestring_word:
            self.herestring_word = False
            self.stdin_text = word
            return
        if self.redirect_target:
            self.redirect_target = False
            if self.redirect_output:
                self.writes.append(word)
            return
        if not self.words:
            self.start_line = self.line
        self.words.append(word)

    # ---------------------------------------------------------------- here-docs
    def read_heredocs(self, i: int) -> int:
        """At ``i`` (just past a newline): the bodies of the here-docs opened on the line before."""
        text, n = self.text, len(self.text)
        for delimiter, strip, owner in self.heredocs:
            body: list[str] = []
            while i < n:
                j = text.find("\n", i)
                j = n if j < 0 else j
                line = text[i:j]
                i = j + 1
                self.line += 1
                if (line.lstrip("\t") if strip else line) == delimiter:
                    break
                body.append(line)
            if isinstance(owner, int) and 0 <= owner < len(self.commands):
                self.commands[owner] = self.commands[owner]._replace(stdin_text="\n".join(body))
        self.heredocs = []
        return min(i, n)

    # ---------------------------------------------------------------- the scan
    def plain_lines(self, i: int) -> int:
        """From ``i`` (a line's start, nothing pending): consume the plain lines that follow."""
        text, n = self.text, len(self.text)
        if self.heredocs or self.words or self.subs:
            return i
        commands, special, deadline = self.commands, SPECIAL, self.deadline
        line_no = self.line
        while i < n:
            j = text.find("\n", i)
            j = n if j < 0 else j
            line = text[i:j]
            if not special.isdisjoint(line):
                break
            words = line.split()
            if words:
                commands.append(Simple(words, line_no, []))
            if j >= n:
                i = n
                break
            line_no += 1
            i = j + 1
            if deadline is not None and not line_no % 128 and time.monotonic() > deadline:
                self.stopped = True
                i = n
                break
        self.line = line_no
        self.after_pipe = False
        return i

    def run(self) -> None:
        """One pass over the text, a character at a time, for the lines ``plain_lines`` cannot split.

        Kept whole, one branch per character class: every branch moves the same position ``i`` and
        the same word being built (``word``, ``in_word``), which live in locals; split into methods,
        each would hand them back and forth through ``self`` on every character of the classifier's
        hottest loop, and the branches would no longer read as the one table of shell syntax they are.
        """
        text, n = self.text, len(self.text)
        i = self.plain_lines(0)
        word: list[str] = []
        in_word = False

        def flush() -> None:
            nonlocal word, in_word
            if in_word:
                self.add_word("".join(word))
            word, in_word = [], False

        while i < n:
            c = text[i]
            if c in BLANKS:
                flush()
                i += 1
            elif c == "\n":
                flush()
                self.end_command()
                self.line += 1
                i = self.read_heredocs(i + 1) if self.heredocs else i + 1
                if self.deadline is not None and time.monotonic() > self.deadline:
                    self.stopped = True
                    return
                i = self.plain_lines(i)
                if self.stopped:
                    return
            elif c == "#" and not in_word:
                j = text.find("\n", i)
                i = n if j < 0 else j
            elif c == "\\":
                if i + 1 < n and text[i + 1] == "\n":
                    self.line += 1
                    i += 2
                    continue
                word.append(text[i + 1 : i + 2])
                in_word = True
                i += 2
            elif c == "'":
                j = text.find("'", i + 1)
                j = n if j < 0 else j
                word.append(text[i + 1 : j])
                self.line += text.count("\n", i, j)
                in_word = True
                i = j + 1
            elif c == '"':
                end = _end_of_double(text, i + 1)
                closed = end - 1 > i and text[end - 1] == '"'
                inner = text[i + 1 : end - 1 if closed else end]
                self.collect_subs(inner)
                word.append(inner.replace('\\"', '"').replace("\\\\", "\\").replace("\\$", "$"))
                self.line += inner.count("\n")
                in_word = True
                i = end
            elif c == "`":
                j = text.find("`", i + 1)
                j = n if j < 0 else j
                self.subs.append(text[i + 1 : j])
                word.append(text[i : j + 1])
                in_word = True
                i = j + 1
            elif c == "$" and text.startswith("$'", i):  # ANSI-C quoting: ca$'r'go is cargo
                end, decoded = _ansi_c(text, i + 2)
                word.append(decoded)
                in_word = True
                i = end
            elif c == "$" and text.startswith("$((", i):
                end = _matching(text, i + 3, "(", ")", depth=2)
                word.append(text[i:end])
                in_word = True
                i = end
            elif c == "$" and text.startswith("$(", i):
                end = _matching(text, i + 2, "(", ")")
                self.subs.append(text[i + 2 : end - 1])
                word.append(text[i:end])
                in_word = True
                i = end
            elif c == "$" and text.startswith("${", i):
                end = _matching(text, i + 2, "{", "}")
                word.append(text[i:end])
                in_word = True
                i = end
            elif c in REDIRECT_CHARS:
                if text.startswith("(", i + 1):  # <( … ) / >( … ): a command, not a redirection
                    end = _matching(text, i + 2, "(", ")")
                    self.subs.append(text[i + 2 : end - 1])
                    word.append(text[i:end])
                    in_word = True
                    i = end
                    continue
                if in_word and not "".join(word).isdigit():
                    flush()
                word, in_word = [], False  # "2>": the fd number is not a word
                op_end = i + 1
                if text.startswith("<<<", i):
                    op_end, self.herestring_word = i + 3, True
                elif text.startswith("<<", i):
                    op_end, self.heredoc_word = i + 2, True
                    self.heredoc_strip = text.startswith("-", op_end)
                    op_end += self.heredoc_strip
                else:
                    dup = op_end < n and text[op_end] == "&"  # >&2, <&0: a descriptor, not a file
                    if op_end < n and text[op_end] in "<>|&":
                        op_end += 1  # >> <> >| >& <&
                    self.redirect_target = True
                    self.redirect_output = c == ">" and not dup
                i = op_end
            elif c == "&" and text.startswith("&>", i):
                flush()
                self.redirect_target = True
                self.redirect_output = True
                i += 3 if text.startswith("&>>", i) else 2
            elif c in OPERATOR_CHARS:
                flush()
                self.end_command()
                self.after_pipe = c == "|" and not text.startswith("||", i)
                i += 2 if text.startswith(("||", "&&", ";;", "|&"), i) else 1
            else:
                if c in "{}" and not in_word:
                    # "{" / "}" alone are the group's reserved words, not command words
                    nxt = text[i + 1 : i + 2]
                    if nxt == "" or nxt in BLANKS or nxt in OPERATOR_CHARS:
                        i += 1
                        continue
                j = i + 1
                while j < n and text[j] not in WORD_STOP:
                    j += 1
                word.append(text[i:j])
                in_word = True
                i = j
        flush()
        self.end_command()
        if self.heredocs:
            self.read_heredocs(n)

    def collect_subs(self, inner: str) -> None:
        """The ``$( … )`` and backtick commands inside a double-quoted string."""
        i = 0
        n = len(inner)
        while i < n:
            c = inner[i]
            if c == "\\":
                i += 2
            elif inner.startswith("$((", i):
                i = _matching(inner, i + 3, "(", ")")
            elif inner.startswith("$(", i):
                end = _matching(inner, i + 2, "(", ")")
                self.subs.append(inner[i + 2 : end - 1])
                i = end
            elif c == "`":
                j = inner.find("`", i + 1)
                j = n if j < 0 else j
                self.subs.append(inner[i + 1 : j])
                i = j + 1
            else:
                i += 1


def parse(text: str, deadline: float | None = None) -> Parsed:
    """The simple commands ``text`` runs, in order (see the module's docstring for what is seen)."""
    parser = _Parser(text, deadline)
    parser.run()
    return Parsed(parser.commands, parser.stopped)
