"""``dispatch.core.pathsearch.which`` answers as ``shutil.which`` does (it exists only to keep
``shutil`` off the report, probe and peer paths), on a real directory tree."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dispatch.core.pathsearch import which


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for sub in ("a", "b", "c"):
        (tmp_path / sub).mkdir()
    (tmp_path / "a" / "tool").write_text("#!/bin/sh\n")          # not executable: skipped
    (tmp_path / "b" / "tool").mkdir()                            # a directory: skipped
    (tmp_path / "c" / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "c" / "tool").chmod(0o755)
    (tmp_path / "c" / "other").write_text("#!/bin/sh\n")
    (tmp_path / "c" / "other").chmod(0o755)
    return tmp_path


@pytest.mark.parametrize("name", ["tool", "other", "missing", "c/tool", "a/tool"])
@pytest.mark.parametrize("dirs", [["a", "b", "c"], ["c", "a"], ["a", "b"], ["c", "c"], ["", "c"], []])
def test_which_agrees_with_shutil(tree: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                                  dirs: list[str]) -> None:
    monkeypatch.chdir(tree)
    path = os.pathsep.join(str(tree / d) if d else "" for d in dirs)
    assert which(name, path=path) == shutil.which(name, path=path)


def test_which_reads_path_from_the_environment(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{tree / 'a'}{os.pathsep}{tree / 'c'}")
    assert which("tool") == str(tree / "c" / "tool") == shutil.which("tool")
    monkeypatch.delenv("PATH")
    assert which("sh") == shutil.which("sh") is not None  # the system's default search path
