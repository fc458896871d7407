"""Which probes a job needs, the toolchain probe's cache and the toolchain files seeded on the peer, on
this machine only (the end-to-end checks with real sshd peers are in test_peer_run.py and, against a
peer without Rust, test_vm_peer.py). Uses the FAKE rustup of
tests/support/fakerustup.py: a proxy file that never changes while the toolchain behind it does."""

from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from dispatch.core.fingerprint import short_hash
from dispatch.guards.toolchain import _key, compare, probe_here, probes_for, seed, selector_files
from tests.support.fakerustup import FakeRustup

STABLE, BETA, NIGHTLY = "rustc 1.80.0 (fake)", "rustc 1.81.0-beta (fake)", "rustc 1.83.0-nightly (fake)"


def test_cached_probe_follows_what_selects_the_rustup_toolchain(tmp_path: Path) -> None:
    rustup = FakeRustup(tmp_path, "stable", {"stable": STABLE, "beta": BETA, "nightly": NIGHTLY})
    log = tmp_path / "proxy.log"
    env = {**rustup.env(os.environ["PATH"]), "HOME": str(tmp_path), "FAKE_RUSTUP_LOG": str(log)}
    tree = tmp_path / "tree"
    job = tree / "src"
    job.mkdir(parents=True)
    cache = tmp_path / "cache"

    def version(**extra: str) -> str:
        result = probe_here(["rustc -Vv"], str(cache), str(job), {**env, **extra})["rustc -Vv"]
        return str(result["output"]).splitlines()[0]

    assert version() == STABLE
    assert version() == STABLE
    assert log.read_text().split() == ["stable"]  # the second answer came from the cache
    rustup.set_default("beta")  # `rustup default beta`: the proxy file is unchanged
    assert version() == BETA
    assert version(RUSTUP_TOOLCHAIN="nightly") == NIGHTLY
    (tree / "rust-toolchain").write_text("nightly\n")  # a directory override above the job's dir
    assert version() == NIGHTLY
    (job / "rust-toolchain.toml").write_text('[toolchain]\nchannel = "stable"\n')  # nearer: wins
    assert version() == STABLE
    shutil.rmtree(rustup.home / "toolchains" / "stable")  # the selected toolchain broken
    assert version() == "error: toolchain 'stable' is not installed"
    assert log.read_text().split() == ["stable", "beta", "nightly", "nightly", "stable"]
    assert oct((cache / "toolchain-probes.json").stat().st_mode & 0o777) == "0o600"


def test_toolchain_files_found_in_the_tree_and_seeded_only_inside_the_copy(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "crates" / "a").mkdir(parents=True)
    (tree / "rust-toolchain.toml").write_text('[toolchain]\nchannel = "1.82.0"\n')
    (tree / "crates" / "rust-toolchain").write_text("nightly\n")
    (tree / "crates" / "a" / "rust-toolchain.toml").symlink_to(tmp_path / "elsewhere")  # not sent
    (tmp_path / "elsewhere").write_text("secret\n")
    os.mkfifo(tree / "crates" / "a" / "rust-toolchain")  # not a file: not read (nor waited on)
    found = selector_files(str(tree), "crates/a")
    assert {k: base64.b64decode(v) for k, v in found.items()} == {
        "rust-toolchain.toml": b'[toolchain]\nchannel = "1.82.0"\n', "crates/rust-toolchain": b"nightly\n"}

    copy = tmp_path / "copy"
    outside = tmp_path / "outside"
    outside.mkdir()
    copy.mkdir()
    (copy / "linked").symlink_to(outside)
    (copy / "rust-toolchain.toml").symlink_to(outside / "target.toml")
    data = base64.b64encode(b"pinned\n").decode()
    seed(str(copy), {**found, "linked/rust-toolchain": data, "../rust-toolchain": data,
                     "/tmp/rust-toolchain": data, "crates/other-file": data})
    assert (copy / "crates" / "rust-toolchain").read_text() == "nightly\n"
    assert (copy / "rust-toolchain.toml").is_symlink()  # a link in the copy is left alone
    assert list(outside.iterdir()) == [] and not (tmp_path / "rust-toolchain").exists()
    assert not (copy / "crates" / "other-file").exists()


def test_probe_cache_planted_by_another_user_is_not_believed(tmp_path: Path, other_user: Any) -> None:
    """Another user's cache directory (or a cache file of theirs in ours) holding a forged output for
    the exact key: the probe runs anyway, and nothing is written into their directory."""
    rustup = FakeRustup(tmp_path, "stable", {"stable": STABLE})
    env = {**rustup.env(os.environ["PATH"]), "HOME": str(tmp_path)}
    job = tmp_path / "job"
    job.mkdir()
    binary = str(rustup.bin / "rustc")
    forged = {short_hash(f"rustc -Vv\0{job}".encode(), 16): {"key": _key(binary, str(job), env),
                                                           "output": "rustc 9.9.9 (forged)"}}
    theirs = other_user.home / "cache"
    theirs.mkdir()
    (theirs / "toolchain-probes.json").write_text(json.dumps(forged))
    other_user.chown(theirs)
    ours = tmp_path / "cache"
    ours.mkdir(mode=0o700)
    (ours / "toolchain-probes.json").write_text(json.dumps(forged))
    other_user.chown(ours / "toolchain-probes.json")
    for cache in (theirs, ours):
        result = probe_here(["rustc -Vv"], str(cache), str(job), env)["rustc -Vv"]
        assert str(result["output"]).splitlines()[0] == STABLE, cache
    assert json.loads((theirs / "toolchain-probes.json").read_text()) == forged
    assert (theirs / "toolchain-probes.json").stat().st_uid == other_user.uid


# ------------------------------------------------------------------------------------ probes by program
@pytest.mark.parametrize(("argv", "probes"), [
    (["sh", "-c", "cat a.txt"], []),  # a peer without Rust must not refuse it
    (["true"], []),
    (["cargo", "build", "--release"], ["rustc -Vv", "cargo -V"]),
    (["rustc", "-V"], ["rustc -Vv"]),
    (["/home/u/.cargo/bin/cargo", "test"], ["rustc -Vv", "cargo -V"]),
    (["sh", "-c", "cd sub && cargo test && pytest -x"], ["rustc -Vv", "cargo -V", "python3 -V"]),
    (["pytest", "-n", "8"], ["python3 -V"]),
    (["python3.11", "-m", "pytest"], ["python3.11 -V", "python3 -V"]),  # words, not positions
    (["/opt/venv/bin/python", "x.py"], ["/opt/venv/bin/python -V"]),  # that interpreter, by its path
    (["npm", "test"], ["node -v"]),
    (["go", "test", "./..."], ["go version"]),
    (["make", "-j8"], ["cc --version"]),
    (["env", "FOO=1", "cmake", "--build", "b"], ["cc --version"]),
    (["bash", "-c", "for i in 1 2; do go build; done"], ["go version"]),
])
def test_probes_follow_the_programs_a_job_runs(tmp_path: Path, argv: list[str], probes: list[str]) -> None:
    assert probes_for(argv, str(tmp_path)) == probes


def test_a_script_in_the_tree_is_read_for_the_programs_it_calls(tmp_path: Path) -> None:
    (tmp_path / "ci.sh").write_text("#!/bin/sh\nset -e\ncargo build  # the crate\nnpm ci\n")
    (tmp_path / "tool.py").write_text("import subprocess\nsubprocess.run(['go', 'vet'])\n")
    assert probes_for(["./ci.sh"], str(tmp_path)) == ["rustc -Vv", "cargo -V", "node -v"]
    assert probes_for(["bash", "ci.sh"], str(tmp_path)) == ["rustc -Vv", "cargo -V", "node -v"]
    assert probes_for(["python3", "tool.py"], str(tmp_path)) == ["python3 -V"]  # 'go', quoted: a word
    (tmp_path / "big.sh").write_bytes(b"cargo build\n" + b"#" * (300 << 10))
    assert probes_for(["./big.sh"], str(tmp_path)) == []  # too large to read
    (tmp_path / "bin").write_bytes(b"\x7fELF\x00cargo")
    assert probes_for(["./bin"], str(tmp_path)) == []  # a binary is not read


def test_configured_probes_are_added_and_programs_replaced(tmp_path: Path) -> None:
    assert probes_for(["true"], str(tmp_path), extra=("uname -r",)) == ["uname -r"]
    assert probes_for(["cargo", "b"], str(tmp_path), extra=("rustc -Vv",)) == ["rustc -Vv", "cargo -V"]
    programs = {"cargo": ("cargo -V",), "bazel": ("bazel --version",), "make": ()}
    assert probes_for(["sh", "-c", "cargo b; bazel build //x; make"], str(tmp_path),
                      programs=programs) == ["cargo -V", "bazel --version"]


def test_the_configured_table_replaces_an_interpreters_probe_too(tmp_path: Path) -> None:
    """``toolchain_programs = { python3 = [] }`` was ignored for python/python3 (the interpreter's
    own ``-V`` was always added); now the table wins, for a versioned interpreter through its
    ``python3`` entry unless it has one of its own."""
    none: dict[str, tuple[str, ...]] = {"python3": ()}
    assert probes_for(["python3", "x.py"], str(tmp_path), programs=none) == []
    assert probes_for(["python3.11", "-c", "1"], str(tmp_path), programs=none) == []
    strict = {"python": ("python -c 'import sys; print(sys.version)'",)}
    assert probes_for(["python", "-V"], str(tmp_path), programs=strict) == list(strict["python"])
    own = {"python3": (), "python3.12": ("python3.12 -VV",)}
    assert probes_for(["python3.12", "t.py"], str(tmp_path), programs=own) == ["python3.12 -VV"]
    assert probes_for(["python3", "x.py"], str(tmp_path)) == ["python3 -V"]  # default unchanged


def _probed(output: str | None) -> dict[str, Any]:
    return {"found": output is not None, "output": output}


@pytest.mark.parametrize(("probe", "here", "there", "differs"), [
    ("python3 -V", "Python 3.11.7", "Python 3.11.2", False),  # a patch release: same ABI and bytecode
    ("python3.11 -V", "Python 3.11.7", "Python 3.11.0rc1", False),
    (".venv/bin/python -V", "Python 3.11.7", "Python 3.12.1", True),  # a minor release refuses
    ("python3 -V", "Python 3.11.7", None, True),
    ("python3 -c 'import sys; print(sys.version)'", "3.11.7 (main)", "3.11.2 (main)", True),
    ("node -v", "v20.20.2", "v20.20.1", True),  # only Python's -V is read to its minor version
])
def test_an_interpreter_is_compared_to_its_minor_version(probe: str, here: str, there: str | None,
                                                          differs: bool) -> None:
    lines = compare({probe: _probed(here)}, {probe: _probed(there)}, "peer1")
    assert bool(lines) == differs, lines
    if differs and there is not None:
        assert lines == [f"{probe}: here {here!r} / peer1 {there!r}"]  # the full lines, as printed
