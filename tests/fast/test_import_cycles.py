"""No import cycles among dispatch's modules, lazy imports included (a lazy import still ties two
modules together: neither can move to a package of its own without the other)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.parts import PART_ORDER

PACKAGE = Path(__file__).resolve().parents[2] / "dispatch"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    paths = {_module(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            for target in targets:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    edges[name].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_sees_lazy_imports() -> None:
    """The check is only worth something if it sees imports inside functions."""
    assert "dispatch.agent.run" in _graph()["dispatch.agent.main"]


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def _external(module: str) -> set[str]:
    """Top-level names of what ``module`` imports from outside dispatch, lazy imports included."""
    path = next(p for p in PACKAGE.rglob("*.py") if _module(p) == module)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"dispatch"}


def _shipped_modules(edges: dict[str, set[str]]) -> set[str]:
    from dispatch.hosts.ssh.bundle import SHIPPED

    return {m for m in edges if m == "dispatch" or m.split(".")[1] in SHIPPED}


def test_the_shipped_packages_import_nothing_controller_only_pydantic_or_rich() -> None:
    """What is shipped to a bare peer (``dispatch/__init__`` and the packages in ``bundle.SHIPPED``)
    must run with the standard library alone and never reach a controller-only module, even lazily."""
    edges = _graph()
    shipped = _shipped_modules(edges)
    assert "dispatch.agent.main" in shipped and "dispatch.cli.main" not in shipped
    reaching = sorted((m, t) for m in shipped for t in edges[m] if t not in shipped)
    assert reaching == [], f"shipped modules importing controller-only ones: {reaching}"
    # (tomli is allowed: agent.prepare tries it, guarded, only on a peer's Python < 3.11 without tomllib.)
    heavy = sorted((m, x) for m in shipped for x in _external(m) & {"pydantic", "rich"})
    assert heavy == [], f"shipped modules importing third-party packages: {heavy}"


def test_the_bundle_holds_exactly_the_shipped_packages() -> None:
    """The zip a peer gets is built from the folders, so what the test above checks is what ships."""
    from dispatch.hosts.ssh.bundle import _files

    edges = _graph()
    in_zip = {path for path, _ in _files()}
    expected = {f"dispatch/{_path(m)}" for m in _shipped_modules(edges)} | {"__main__.py"}
    assert in_zip == expected


def _path(module: str) -> str:
    return next(p for p in PACKAGE.rglob("*.py") if _module(p) == module).relative_to(PACKAGE).as_posix()


def test_the_core_imports_only_itself() -> None:
    """``dispatch.core`` is the vocabulary: it may not lean on any other part."""
    edges = _graph()
    leaning = sorted((m, t) for m in edges if m.startswith("dispatch.core.")
                     for t in edges[m] if not t.startswith("dispatch.core") and t != "dispatch")
    assert leaning == []



def _part(module: str) -> str | None:
    """The part a module belongs to (``dispatch.local.run.runner`` → ``local``); None for the package's
    own ``__init__``/``__main__``, which stand outside the order."""
    names = module.split(".")
    return names[1] if len(names) > 2 or (len(names) == 2 and names[1] in PART_ORDER) else None


def test_the_parts_import_only_downwards() -> None:
    edges = _graph()
    parts = {p for m in edges if (p := _part(m)) is not None}
    assert parts == set(PART_ORDER), f"a part missing from PART_ORDER (or gone): {parts ^ set(PART_ORDER)}"
    rank = {part: i for i, part in enumerate(PART_ORDER)}
    upward = sorted((m, t) for m in edges for t in edges[m]
                    if (a := _part(m)) is not None and (b := _part(t)) is not None and rank[b] > rank[a])
    assert upward == [], f"imports up the part order {' < '.join(PART_ORDER)}: {upward}"


def test_the_part_check_sees_an_upward_import() -> None:
    """The check above must be able to fail: a known downward edge, read the other way, is upward."""
    edges = _graph()
    assert "dispatch.core.errors" in edges["dispatch.local.run.runner"]
    rank = {part: i for i, part in enumerate(PART_ORDER)}
    assert rank[_part("dispatch.local.run.runner") or ""] > rank[_part("dispatch.core.errors") or ""]


def test_no_test_module_imports_another() -> None:
    """Helpers and fakes that several test modules use live in ``tests/support``; a test module that
    imports another runs that module's import-time code and ties the two together."""
    tests = Path(__file__).resolve().parents[1]
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if name.split(".")[-1].startswith("test_") or name.startswith("tests.test_"):
                    found.append(f"{path.relative_to(tests)}: {name}")
    assert found == []
