"""docs/design.md's parts table and module list are the code's own words: each part's and module's
docstring (its first sentence), in the part order the import test holds (``tests/support/partstable.py``
makes them; ``python -m tests.support.partstable --write`` writes them after a change)."""

from __future__ import annotations

from pathlib import Path

from tests.support.partstable import first_sentence, render, written


def test_the_design_documents_parts_and_modules_are_the_docstrings() -> None:
    assert written() == render(), "docs/design.md differs: run python -m tests.support.partstable --write"


def test_a_first_sentence_stops_at_the_first_full_stop_and_not_inside_an_abbreviation(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""One thing, e.g. a lock\nand its file. The rest.\n\nMore."""\n')
    assert first_sentence(module) == "One thing, e.g. a lock and its file."
