"""Each part's face (its ``__init__``: ``SURFACE``, ``__all__`` and the typing block) is what the
command line may use of it, as httpx's ``test_exported_members`` holds its public names: ``dispatch.cli``
imports parts only through their faces; every name a face declares resolves to what its table
names; importing a face loads none of its modules (the hot path)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dispatch"
FACES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py") if "SURFACE" in p.read_text())


def _cli_imports() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dispatch."):
                found.append((path.name, node.lineno, node.module or ""))
            elif isinstance(node, ast.Import):
                found += [(path.name, node.lineno, a.name) for a in node.names
                          if a.name.startswith("dispatch.")]
    return found


def test_the_command_line_imports_other_parts_only_through_their_faces() -> None:
    behind = [f"{name}:{line}: {module}" for name, line, module in _cli_imports()
              if module.split(".")[1] != "cli" and module.count(".") > 1]
    assert behind == []
    used = {module.split(".")[1] for _, _, module in _cli_imports()} - {"cli"}
    assert used <= set(FACES) | {"config", "capping"}, used


def _typing_only(module: str) -> set[str]:
    """The names ``module`` defines only under ``if MYPY:`` (type aliases)."""
    path = PACKAGE.parent / (module.replace(".", "/") + ".py")
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "MYPY":
            names |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets
                      if isinstance(t, ast.Name)}
    return names


@pytest.mark.parametrize("part", FACES)
def test_every_declared_name_resolves_to_what_the_face_names(part: str) -> None:
    face = importlib.import_module(f"dispatch.{part}")
    assert sorted(face.__all__) == sorted(face.SURFACE)
    for name, target in face.SURFACE.items():
        module, _, attr = target.partition(":")
        if (attr or name) in _typing_only(module):  # a type alias: for the type checker alone
            continue
        assert getattr(face, name) is getattr(importlib.import_module(module), attr or name), name
    with pytest.raises(AttributeError, match="has no attribute 'not_on_the_surface'"):
        face.not_on_the_surface  # noqa: B018


@pytest.mark.parametrize("part", FACES)
def test_the_typing_block_declares_exactly_the_surface(part: str) -> None:
    """mypy reads the names from the ``if MYPY:`` imports; they must be the table's, no more."""
    tree = ast.parse((PACKAGE / part / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "MYPY")
    declared = {alias.asname or alias.name: f"{node.module}:{alias.name}"
                for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    face = importlib.import_module(f"dispatch.{part}")
    expected = {name: target if ":" in target else f"{target}:{name}"
                for name, target in face.SURFACE.items()}
    assert declared == expected


def test_importing_every_face_loads_none_of_their_modules() -> None:
    code = ("import sys\n" + "".join(f"import dispatch.{p}\n" for p in FACES) +
            "print(sorted(m for m in sys.modules if m.startswith('dispatch.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    modules = set(ast.literal_eval(loaded))
    extra = modules - {f"dispatch.{p}" for p in FACES} - {"dispatch.core.faces"}
    # capping's and config's faces hold code of their own, with their own imports
    assert all(m.split(".")[1] in ("capping", "config") or m.startswith("dispatch.core.")
               for m in extra), extra
    heavy = ("dispatch.local.", "dispatch.hosts.", "dispatch.hooks.", "dispatch.placement.")
    assert not any(m.startswith(heavy) for m in modules), modules


def test_each_subcommand_name_has_its_handler_in_the_same_order() -> None:
    """The names live below the command line (the hooks' classifier reads them), the handlers in it."""
    from dispatch.cli.common import COMMANDS
    from dispatch.core.runoptions import SUBCOMMANDS

    assert tuple(COMMANDS) == SUBCOMMANDS
    for module, function in COMMANDS.values():
        assert callable(getattr(importlib.import_module(f"dispatch.cli.{module}"), function))
