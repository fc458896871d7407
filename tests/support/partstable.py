"""docs/design.md's table of parts and list of modules, made from the code: each part's and module's
docstring (its first sentence), the part order (``tests/support/parts.py``) and the bundle's
shipped packages. ``tests/fast/test_design_parts.py`` fails when the document differs; then run
``python -m tests.support.partstable --write`` and read the diff.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dispatch"
DESIGN = ROOT / "docs" / "design.md"
BEGIN = "<!-- parts: made by `python -m tests.support.partstable --write` from the docstrings -->"
END = "<!-- parts: end -->"


def first_sentence(path: Path) -> str:
    """The docstring's first sentence (up to a period that ends a sentence, in its first paragraph),
    on one line; a module without a docstring is a failure of its own."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        raise SystemExit(f"{path.relative_to(ROOT)}: no docstring (every module says what it is)")
    paragraph = " ".join(doc.split("\n\n")[0].split())
    match = re.search(r"\.(?=\s|$)(?<!e\.g\.)(?<!i\.e\.)", paragraph)
    return paragraph[: match.end()] if match else paragraph


def _modules(part: Path) -> list[Path]:
    """A part's modules, its sub-packages' after its own; faces (``__init__``) are the part's."""
    own = sorted(p for p in part.glob("*.py") if p.name != "__init__.py")
    subs = sorted(p for p in part.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    return own + [m for sub in subs for m in [sub / "__init__.py", *_modules(sub)]]


def _name(module: Path, part: Path) -> str:
    rel = module.relative_to(part)
    return f"{rel.parent}/" if rel.name == "__init__.py" else str(rel.with_suffix(""))


def render() -> str:
    sys.path.insert(0, str(ROOT))
    from dispatch.hosts.ssh.bundle import SHIPPED
    from tests.support.parts import PART_ORDER

    rows = ["| folder | modules | what it is | shipped to peers |", "|---|---|---|---|"]
    listing = []
    for name in PART_ORDER:
        part = PACKAGE / name
        modules = _modules(part)
        names = ", ".join(f"`{_name(m, part)}`" for m in modules)
        rows.append(f"| `{name}/` | {names} | {first_sentence(part / '__init__.py')} | "
                    f"{'yes' if name in SHIPPED else 'no'} |")
        listing.append(f"\n**`{name}/`**\n")
        listing += [f"- `{_name(m, part)}`: {first_sentence(m)}" for m in modules]
    return "\n".join([BEGIN, "", *rows, "", "The modules, each by its docstring's first sentence:",
                      *listing, "", END])


def written() -> str:
    text = DESIGN.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        text = DESIGN.read_text()
        DESIGN.write_text(text.replace(written(), render()))
        return 0
    print(render())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
