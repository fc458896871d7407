"""dispatch.hooks.classify: real-world command lines, table-driven (heavy? GPU? through hostrun? why?).

Scripts in command position are real files in a temporary tree; nothing here needs root or cgroups.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch.hooks.classify import Classification, classify, classify_argv
from dispatch.hooks.shellwords import parse

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, text: str | bytes, mode: int = 0o755) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    path.chmod(mode)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project directory with the scripts the table names."""
    root = tmp_path_factory.mktemp("project")
    _write(root / "scripts/all-tests", "#!/bin/bash\nset -e\n# run everything\necho start\n"
           "cd crates\n" + "echo step\n" * 6 + "cargo test --workspace\n")
    _write(root / "scripts/lint", "#!/usr/bin/env bash\ncargo fmt --check\ngit diff --stat\n")
    _write(root / "scripts/ci", "#!/bin/sh\n./scripts/lint\n./scripts/all-tests\n")
    _write(root / "run.sh", "echo hi\nmake -j8\n", 0o644)  # no shebang, not executable
    _write(root / "light.sh", "echo hi; ls -la\n")
    _write(root / "rec.sh", "#!/bin/sh\necho again\n./rec.sh\n")  # calls itself
    _write(root / "self.sh", "#!/bin/bash\n. ./self.sh\nsource self.sh\necho once\n")  # sources itself
    _write(root / "selfheavy.sh", "#!/bin/bash\nsource ./selfheavy.sh\ncargo build --release\n")
    _write(root / "ping.sh", "#!/bin/sh\nbash pong.sh\n")
    _write(root / "pong.sh", "#!/bin/sh\nbash ping.sh\npytest -q tests\n")
    _write(root / "src/build.rs", "#![allow(unused)]\n// cargo build\nfn main() { cargo test }\n")
    _write(root / "src/lib.rs", "#!/bin/bash\n")  # a shebang cannot make a .rs file a script
    _write(root / "tool", b"\x7fELF\x02\x01\x01\x00\x00cargo test\x00\x00" * 20)
    _write(root / "huge.sh", "echo padding\n" * 30000)  # ~390 KiB > 256 KiB
    for k in range(1, 7):  # deep1.sh → deep2.sh → … → deep6.sh, the last heavy
        body = "cargo test\n" if k == 6 else f"echo level {k}\n./deep{k + 1}.sh\n"
        _write(root / f"deep{k}.sh", "#!/bin/sh\n" + body)
    _write(root / "train.py", "#!/usr/bin/env python3\nprint('training')\n")
    _write(root / "tools/gen.py", "print('cargo build')\n")
    _write(root / "tools/report.js", "#!/usr/bin/env node\n// make all\n")
    _write(root / "tools/fetch-data", "#!/usr/bin/env python3\nimport sys\n")
    _write(root / "gradlew", "#!/bin/sh\nexec java -jar gradle-wrapper.jar \"$@\"\n")
    _write(root / "env.sh", "export RUSTFLAGS=-Dwarnings\nexport PATH=$PATH:/opt/bin\n", 0o644)
    _write(root / "heavy-env.sh", "export X=1\nmake prepare\n", 0o644)
    _write(root / "wrapped.sh", "#!/bin/bash\nhostrun -m 8G -- cargo test --workspace\n")
    _write(root / "mixed.sh", "#!/bin/bash\nhostrun -- cargo test\ncargo build\n")
    _write(root / "doc.sh", "#!/bin/bash\ncat <<EOF\ncargo test\nEOF\necho done\n")
    _write(root / "feed.sh", "#!/bin/bash\nbash <<'EOF'\ncd x\nninja -C build\nEOF\n")
    _write(root / "gpu.sh", "#!/bin/bash\nCUDA_VISIBLE_DEVICES=0,1 python3 finetune.py\n")
    _write(root / "loop.sh", "#!/bin/bash\nfor t in a b c; do\n  cargo test -p \"$t\"\ndone\n")
    _write(root / "cond.sh", "#!/bin/bash\nif [ -f x ]; then\n  go test ./...\nfi\n")
    _write(root / "fn.sh", "#!/bin/bash\nbuild() {\n  cargo build --release\n}\nbuild\n")
    _write(root / "quoted.sh", "#!/bin/bash\necho 'cargo test'\necho \"make all\"\n")
    _write(root / "unbalanced.sh", "#!/bin/bash\necho \"never closed\ncargo test\n")
    _write(root / "crlf.sh", "#!/bin/bash\r\necho hi\r\ncargo test\r\n")
    _write(root / "sub/inner.sh", "#!/bin/sh\npytest\n")
    _write(root / "noext", "ls\ncargo clippy --all-targets\n", 0o644)
    _write(root / "notes.txt", "cargo test\n", 0o644)
    _write(root / "big.rs", "fn main() {}\n" * 8000, 0o644)  # ~100 KiB
    _write(root / "small.rs", "fn main() {}\n", 0o644)
    (root / "adir").mkdir()
    return root


# (command, flags, piece of why): flags H heavy / L light, G GPU, T through hostrun
ROWS: list[tuple[str, str, str]] = [
    # --- plain heavy commands
    ("cargo build", "H", "cargo build"),
    ("cargo build --release", "H", "[heavy: cargo build]"),
    ("cargo b -r", "H", "cargo b"),
    ("cargo test --workspace", "H", "cargo test"),
    ("cargo t", "H", "cargo t"),
    ("cargo +nightly test -p core", "H", "cargo test"),
    ("cargo --locked test", "H", "cargo test"),
    ("cargo --manifest-path sub/Cargo.toml test", "H", "cargo test"),
    ("cargo bench", "H", "cargo bench"),
    ("cargo nextest run --workspace", "H", "cargo nextest"),
    ("cargo clippy --all-targets -- -D warnings", "H", "cargo clippy"),
    ("cargo run --bin server", "H", "cargo run"),
    ("cargo check --workspace", "H", "cargo check"),
    ("cargo doc --no-deps", "H", "cargo doc"),
    ("cargo install ripgrep", "H", "cargo install"),
    ("cargo test --no-run", "H", "cargo test"),
    ("cargo miri test", "H", "cargo miri"),
    ("cargo llvm-cov --html", "H", "cargo llvm-cov"),
    ("make", "H", "[heavy: make]"),
    ("make -j8 all", "H", "make"),
    ("make -C build install", "H", "make"),
    ("gmake test", "H", "gmake"),
    ("ninja -C out", "H", "ninja"),
    ("cmake --build build -j 16", "H", "cmake --build"),
    ("meson compile -C builddir", "H", "meson compile"),
    ("ctest --output-on-failure", "H", "ctest"),
    ("pytest", "H", "[heavy: pytest]"),
    ("pytest -x -q tests/test_foo.py", "H", "pytest"),
    ("py.test tests", "H", "py.test"),
    ("tox -e py311", "H", "tox"),
    ("nox -s tests", "H", "nox"),
    ("go build ./...", "H", "go build"),
    ("go test -race ./...", "H", "go test"),
    ("go vet ./...", "H", "go vet"),
    ("npm test", "H", "npm test"),
    ("npm run build", "H", "npm run build*"),
    ("npm run build:prod", "H", "npm run build*"),
    ("npm --prefix web run test", "H", "npm run test*"),
    ("pnpm build", "H", "pnpm build"),
    ("pnpm run test", "H", "pnpm run test*"),
    ("yarn build", "H", "yarn build"),
    ("yarn test --watch=false", "H", "yarn test"),
    ("mvn -q package", "H", "[heavy: mvn]"),
    ("./mvnw verify", "H", "mvnw"),
    ("gradle build", "H", "gradle"),
    ("./gradlew build", "H", "[heavy: gradlew]"),
    ("bazel build //...", "H", "bazel build"),
    ("bazel test //foo:all", "H", "bazel test"),
    ("buck2 build //app:app", "H", "buck2 build"),
    ("dotnet test", "H", "dotnet test"),
    ("docker build -t app .", "H", "docker build"),
    ("python setup.py build_ext --inplace", "H", "setup.py build*"),
    ("python3 manage.py test app.tests", "H", "manage.py test"),
    ("python3 manage.py migrate", "L", "[no heavy pattern]"),
    ("rustc -O big.rs", "H", "[heavy: rustc]"),
    ("rustc small.rs", "L", "rustc on small input"),
    ("rustc missing.rs", "H", "[heavy: rustc]"),  # not known: counted heavy
    # --- GPU
    ("torchrun --nproc_per_node 8 train.py", "HG", "[gpu: torchrun]"),
    ("accelerate launch train.py --config cfg.yaml", "HG", "accelerate launch"),
    ("deepspeed --num_gpus 2 main.py", "HG", "deepspeed"),
    ("python train.py --epochs 3", "HG", "python* *train*"),
    ("python3 -u scripts/train_lora.py", "HG", "*train*"),
    ("python3 -m torch.distributed.run --nproc 4 main.py", "HG", "torch.distributed.run"),
    ("python -m mypkg.train", "HG", "*train*"),
    ("CUDA_VISIBLE_DEVICES=0 ./tool", "HG", "CUDA_VISIBLE_DEVICES"),
    ("CUDA_VISIBLE_DEVICES=1 python3 infer.py", "HG", "CUDA_VISIBLE_DEVICES"),
    ("CUDA_VISIBLE_DEVICES=0 cargo test", "HG", "cargo test"),
    ("CUDA_VISIBLE_DEVICES=0 nvidia-smi", "L", "nvidia-smi"),
    ("torchrun --help", "L", "* --help"),
    ("./train.py", "HG", "*train*"),
    ("bash gpu.sh", "HG", "gpu.sh line 2"),
    # --- light
    ("cargo --version", "L", "* --version"),
    ("cargo -V", "L", "cargo -V"),
    ("cargo fmt", "L", "[light: cargo fmt]"),
    ("cargo fmt --all -- --check", "L", "cargo fmt"),
    ("cargo metadata --format-version 1", "L", "cargo metadata"),
    ("cargo tree -d", "L", "cargo tree"),
    ("cargo clean", "L", "cargo clean"),
    ("cargo", "L", "[no heavy pattern]"),
    ("cargo test --help", "L", "* --help"),
    ("cargo build -h", "L", "* -h"),
    ("pytest --collect-only -q", "L", "pytest --collect-only"),
    ("pytest --co", "L", "pytest --co"),
    ("pytest --version", "L", "* --version"),
    ("python -m pytest --collect-only", "L", "pytest --collect-only"),
    ("make -n", "L", "make -n"),
    ("make --dry-run install", "L", "make --dry-run"),
    ("make clean", "L", "make clean"),
    ("make -C sub clean", "L", "make clean"),
    ("git status", "L", "[light: git]"),
    ("git log --oneline -5", "L", "git"),
    ("git commit -m 'cargo test passes'", "L", "git"),
    ("ls -la", "L", "ls"),
    ("rg -n 'cargo test' src", "L", "rg"),
    ("cat Cargo.toml", "L", "cat"),
    ("echo cargo test", "L", "echo"),
    ("grep -r make .", "L", "grep"),
    ("go version", "L", "go version"),
    ("npm install", "L", "npm install"),
    ("npm run lint", "L", "npm run lint"),
    ("pip install -e .", "L", "pip"),
    ("python3 -c 'print(1)'", "L", "python3 -c"),
    ("python -c 'import train'", "L", "python -c"),
    ("python tools/gen.py", "L", "[no heavy pattern]"),
    ("rustc --version", "L", "--version"),
    ("rustc --explain E0308", "L", "rustc --explain"),
    ("ninja -t targets", "L", "ninja -t"),
    ("mvn --version", "L", "--version"),
    ("./configure --prefix=/usr", "L", "configure"),
    ("hostrun report", "L", "hostrun report"),
    ("hostrun --config x.toml ledger", "L", "hostrun ledger"),
    ("hostrun dispatch -- cargo test", "L", "hostrun dispatch"),
    ("hostrun --help", "L", "hostrun --help"),
    ("command -v cargo", "L", "looks a command up"),
    ("env", "L", "prints the environment"),
    ("sudo -i", "L", "no command"),
    ("", "L", "nothing to run"),
    ("   ", "L", "nothing to run"),
    ("# cargo test", "L", "nothing to run"),
    ("FOO=1", "L", "nothing to run"),
    # --- compound forms
    ("cd crates/core && cargo test", "H", "cargo test"),
    ("cargo fmt && cargo clippy", "H", "cargo clippy"),
    ("git pull; make", "H", "make"),
    ("cargo test || echo failed", "H", "cargo test"),
    ("cargo test 2>&1 | tail -5", "H", "cargo test"),
    ("cargo test |& tee log", "H", "cargo test"),
    ("(cd sub && make)", "H", "make"),
    ("{ cargo build; cargo test; }", "H", "cargo build"),
    ("cargo build &", "H", "cargo build"),
    ("nohup cargo build > build.log 2>&1 &", "H", "cargo build"),
    ("echo start\ncargo test\necho end", "H", "cargo test"),
    ("git status && git diff", "L", "git"),
    ("ls | wc -l", "L", "ls"),
    ("echo $(cargo metadata --format-version 1 | jq .)", "L", "cargo metadata"),
    ("echo $(cargo build 2>&1)", "H", "cargo build"),
    ("VERSION=`make version`", "H", "make"),
    ('echo "built: $(cargo build --release)"', "H", "cargo build"),
    ("diff <(cargo test 2>&1) expected.txt", "H", "cargo test"),
    ("if cargo check; then echo ok; fi", "H", "cargo check"),
    ("while true; do cargo test; done", "H", "cargo test"),
    ("for c in a b; do cargo test -p $c; done", "H", "cargo test"),
    ("case $x in a) make;; esac", "H", "make"),
    ("! pytest -x", "H", "pytest"),
    ("time cargo build", "H", "cargo build"),
    ("time -p make", "H", "make"),
    ("cargo build \\\n  --release", "H", "cargo build"),
    # --- prefixes
    ("FOO=1 BAR=2 cargo test", "H", "cargo test"),
    ("RUST_BACKTRACE=1 cargo test -- --nocapture", "H", "cargo test"),
    ("env RUSTFLAGS=-Dwarnings cargo build", "H", "cargo build"),
    ("env -i PATH=/usr/bin make", "H", "make"),
    ("env -u HOME -C sub cargo test", "H", "cargo test"),
    ("env -S 'cargo test --release'", "H", "cargo test"),
    ("/usr/bin/time -v cargo build", "H", "cargo build"),
    ("timeout 600 cargo test", "H", "cargo test"),
    ("timeout -s KILL 10m pytest", "H", "pytest"),
    ("timeout --signal=INT -k 5 60 make", "H", "make"),
    ("nice cargo build", "H", "cargo build"),
    ("nice -n 19 cargo build", "H", "cargo build"),
    ("nice -10 make", "H", "make"),
    ("ionice -c3 make -j4", "H", "make"),
    ("ionice -c 2 -n 7 cargo test", "H", "cargo test"),
    ("nohup pytest", "H", "pytest"),
    ("sudo make install", "H", "make"),
    ("sudo -u builder -E cargo build", "H", "cargo build"),
    ("sudo -E env CUDA_VISIBLE_DEVICES=0 ./tool", "HG", "CUDA_VISIBLE_DEVICES"),
    ("command cargo test", "H", "cargo test"),
    ("exec cargo run", "H", "cargo run"),
    ("exec -a builder make", "H", "make"),
    ("find . -name '*.toml' | xargs -n1 cargo check --manifest-path", "H", "cargo check"),
    ("xargs -P4 -I{} make -C {}", "H", "make"),
    ("ls | xargs", "L", "ls"),
    ("xargs < list", "L", "no command"),
    ("find . -name Cargo.toml -execdir cargo build \\;", "H", "cargo build"),
    ("find . -name '*.o' -exec rm {} +", "L", "rm"),
    ("stdbuf -oL cargo test", "H", "cargo test"),
    ("taskset -c 0-3 make", "H", "make"),
    ("flock /tmp/lock cargo build", "H", "cargo build"),
    ("flock /tmp/lock -c 'make all'", "H", "make"),
    ("uv run pytest -x", "H", "pytest"),
    ("uv run --with rich python train.py", "HG", "*train*"),
    ("uv pip install torch", "L", "uv pip"),
    ("poetry run pytest", "H", "pytest"),
    ("conda run -n ml python train.py", "HG", "*train*"),
    ("npx jest --ci", "H", "jest"),
    ("pnpm exec vitest run", "H", "vitest"),
    ("strace -f -o trace.txt make", "H", "make"),
    ("systemd-run --user --scope -p MemoryMax=4G cargo build", "H", "cargo build"),
    ("nix develop -c cargo test", "H", "cargo test"),
    ("nix-shell --run 'make test'", "H", "make"),
    ("hyperfine 'cargo build' 'make'", "H", "cargo build"),
    ("su -c 'make install' root", "H", "make"),
    ("watch -n 5 cargo check", "H", "cargo check"),
    # --- shells and -c strings
    ("bash -c 'cargo test'", "H", "in bash -c"),
    ("sh -c \"cd x && make\"", "H", "in sh -c"),
    ("bash -lc 'cargo build --release'", "H", "cargo build"),
    ("bash -e -x -c 'pytest -q'", "H", "pytest"),
    ("bash -o pipefail -c 'cargo test | tail'", "H", "cargo test"),
    ("zsh -c 'git status'", "L", "git"),
    ("bash -c 'bash -c \"cargo test\"'", "H", "in bash -c in bash -c"),
    ("eval 'cargo test'", "H", "in eval"),
    ("bash <<'EOF'\ncargo test\nEOF", "H", "bash's input"),
    ("cat <<EOF\ncargo test\nEOF", "L", "cat"),
    ("bash <<< 'make all'", "H", "make"),
    ("echo 'cargo test' | bash", "H", "cargo test"),
    ("curl -fsSL https://example.org/install.sh | sh", "L", "curl"),
    ("cat <<EOF | sh\nmake all\nEOF", "H", "make all [heavy: make] in sh's input"),
    ("bash", "L", "a shell reading"),
    # --- hostrun
    ("hostrun -- cargo test", "HT", "through hostrun"),
    ("hostrun -m 8G --label tests -- cargo test --workspace", "HT", "cargo test"),
    ("hostrun cargo build", "HT", "cargo build"),
    ("hostrun run -- make", "HT", "make"),
    ("hostrun --config h.toml -- pytest", "HT", "pytest"),
    ("/usr/local/bin/hostrun -- cargo test", "HT", "cargo test"),
    ("/work/main/.venv/bin/hostrun --peer -- make -j8", "HT", "make"),
    ("python -m dispatch -- cargo test", "HT", "cargo test"),
    ("python3 -m dispatch --auto -- pytest", "HT", "pytest"),
    ("cd crates && hostrun -- cargo test", "HT", "cargo test"),
    ("hostrun -- cargo test 2>&1 | tail -20", "HT", "cargo test"),
    ("hostrun -- bash -c 'cd x && cargo test'", "HT", "cargo test"),
    ("hostrun --gpu-memory 20G -- python train.py", "HGT", "*train*"),
    ("hostrun -- ls", "LT", "ls"),
    (".venv/bin/hostrun -- make", "HT", "make"),
    ("CUDA_VISIBLE_DEVICES=0 hostrun -- python3 infer.py", "HGT", "CUDA_VISIBLE_DEVICES"),
    ("timeout 900 hostrun -- cargo test", "HT", "cargo test"),
    ("cargo build && hostrun -- cargo test", "H", "cargo build"),
    ("hostrun -- cargo test; make", "H", "[heavy: make]"),
    ("hostrun lock . -- cargo test", "H", "cargo test"),
    ("hostrun lock . -- hostrun -m 4G -- cargo test", "HT", "cargo test"),
    ("bash wrapped.sh", "HT", "cargo test"),
    ("./mixed.sh", "H", "cargo build [heavy: cargo build] in ./mixed.sh line 3"),
    # --- scripts in command position
    ("./scripts/all-tests", "H", "cargo test --workspace [heavy: cargo test] in ./scripts/all-tests line 12"),
    ("scripts/all-tests --quick", "H", "in scripts/all-tests line 12"),
    ("bash scripts/all-tests", "H", "scripts/all-tests line 12"),
    ("sh -e scripts/all-tests", "H", "scripts/all-tests line 12"),
    ("./scripts/lint", "L", "cargo fmt"),
    ("./scripts/ci", "H", "./scripts/all-tests line 12"),
    ("bash run.sh", "H", "make -j8 [heavy: make] in run.sh line 2"),
    ("sh light.sh", "L", "light.sh line 1"),
    ("./rec.sh", "L", "echo"),
    ("./self.sh", "L", "echo"),
    ("bash selfheavy.sh", "H", "selfheavy.sh line 3"),
    ("./ping.sh", "H", "pong.sh line 3"),
    ("bash src/build.rs", "L", "not read as a script"),
    ("./src/build.rs", "L", "not read as a script"),
    ("source src/lib.rs", "L", "not read as a script"),
    ("./tool --flag", "L", "[no heavy pattern]"),
    ("./nope.sh", "L", "not found"),
    ("bash missing.sh", "L", "not found"),
    ("./adir", "L", "[no heavy pattern]"),
    ("source env.sh && cargo fmt", "L", "export RUSTFLAGS=-Dwarnings [light: export] in env.sh line 1"),
    (". ./env.sh; make", "H", "make"),
    ("source heavy-env.sh", "H", "heavy-env.sh line 2"),
    (". heavy-env.sh", "H", "heavy-env.sh line 2"),
    ("cd sub && ./inner.sh", "H", "./inner.sh line 2"),
    ("cd sub; cd ..; ./run.sh", "H", "./run.sh line 2"),
    ("./doc.sh", "L", "cat"),
    ("./feed.sh", "H", "ninja"),
    ("./loop.sh", "H", "./loop.sh line 3"),
    ("./cond.sh", "H", "go test"),
    ("./fn.sh", "H", "./fn.sh line 3"),
    ("./quoted.sh", "L", "echo"),
    ("./unbalanced.sh", "L", "echo"),
    ("./crlf.sh", "H", "cargo test"),
    ("./noext", "H", "cargo clippy"),
    ("bash notes.txt", "L", "not read as a script"),
    ("./tools/report.js", "L", "a .js file is not read"),
    ("./tools/fetch-data", "L", "[no heavy pattern]"),
    ("./train.py --lr 1e-4", "HG", "*train*"),
    ("timeout 60 ./scripts/all-tests", "H", "all-tests line 12"),
    ("hostrun -- ./scripts/all-tests", "HT", "all-tests line 12"),
    ("bash $SCRIPT", "H", "only known when it runs"),  # unknown: counted heavy
    # issue 21: evasions and one-line scripts found by trying
    ("ca$'r'go build", "H", "heavy: cargo build"),
    ("$(echo cargo) build", "H", "names a command only known when it runs"),
    ("alias c=cargo; c build", "H", "heavy: cargo build"),
    ("time -- cargo build", "H", "heavy: cargo build"),
    ("time -p cargo build", "H", "heavy: cargo build"),
    ("tmux new -d 'cargo build --release'", "H", "in tmux new"),
    ("tmux new-session -d -s w cargo test", "H", "in tmux new-session"),
    ("tmux send-keys -t w 'make -j8' Enter", "H", "in tmux send-keys"),
    ("tmux ls", "L", "no heavy pattern"),
    ("screen -dmS w cargo test", "H", "in screen"),
    ("screen -ls", "L", "no heavy pattern"),
    ("cat > /tmp/hostrun-t.sh <<EOF\ncargo test\nEOF\nbash /tmp/hostrun-t.sh", "H",
     "(written in this command)"),
    ("echo 'cargo test' > t.sh; sh t.sh", "H", "t.sh (written in this command) line 1"),
    ("printf 'make -j8\\n' | tee run2.sh; bash run2.sh", "H", "(written in this command)"),
    ("echo 'ls -la' > l.sh; sh l.sh", "L", "echo ls -la [light: echo]"),
    ("parallel cargo test -p {} ::: a b", "H", "in parallel"),
    ("parallel 'make -C {}' ::: a b", "H", "in parallel"),
    ("for c in a b; do cargo test -p $c; done", "H", "heavy: cargo test"),
    ("ls | xargs -n1 cargo test -p", "H", "heavy: cargo test"),
    ("./target/release/sim --threads 31", "H", "a built program run with a workload option"),
    ("./build/bench -j8", "H", "a built program run with a workload option"),
    ("./target/release/sim --help", "L", "light: * --help"),
    ("./target/release/sim --version", "L", "light: * --version"),
    ("qemu-system-x86_64 -m 4G disk.img", "H", "qemu-system-*"),
    ("dune build", "H", "heavy: dune build"),
    # --- quoting edge cases and malformed input (never a crash)
    ("echo \"unbalanced", "L", "echo"),
    ("cargo test 'unbalanced", "H", "cargo test"),
    ("echo 'a;b' && echo \"c|d\"", "L", "echo"),
    ("echo 'cargo test'; ls", "L", "echo"),
    ("echo \\; cargo test", "L", "echo"),
    ("echo a\\ b", "L", "echo"),
    ("\"cargo\" \"test\"", "H", "cargo test"),
    ("c'ar'go te\"st\"", "H", "cargo test"),
    ("echo $((1 + 2))", "L", "echo"),
    ("echo ${HOME:-/root}", "L", "echo"),
    ("echo $(", "L", "echo"),
    ("( ( (", "L", "nothing to run"),
    ("}}}{{{", "L", "[no heavy pattern]"),
    ("&& ||;;", "L", "nothing to run"),
    ("cargo test >", "H", "cargo test"),
    ("<<", "L", "nothing to run"),
    ("bash -c", "L", "nothing to run"),
    ("sudo", "L", "no command"),
    ("timeout", "L", "no command"),
]


@pytest.mark.parametrize(("command", "flags", "why"), ROWS, ids=[r[0][:40] or "<empty>" for r in ROWS])
def test_table(tree: Path, command: str, flags: str, why: str) -> None:
    env = {"HOME": str(tree)}
    verdict = classify(command, str(tree), env=env)
    assert isinstance(verdict, Classification)
    got = ("H" if verdict.heavy else "L") + ("G" if verdict.gpu else "") + \
        ("T" if verdict.through_hostrun else "")
    assert (got, why in verdict.why) == (flags, True), verdict


def test_the_table_is_big_enough() -> None:
    assert len(ROWS) >= 150


# -------------------------------------------------------------------- limits
def test_a_huge_script_is_not_read_and_counts_heavy(tree: Path) -> None:
    v = classify("bash huge.sh", str(tree), env={})
    assert (v.heavy, v.incomplete) == (True, True)
    assert "huge.sh is too big to read" in v.why and "unknown, counted heavy" in v.why


def test_unknown_can_count_light(tree: Path) -> None:
    v = classify("bash huge.sh", str(tree), env={}, unknown_heavy=False)
    assert (v.heavy, v.incomplete) == (False, True)
    assert "unknown: huge.sh is too big to read" in v.why


def test_a_bigger_size_limit_reads_it(tree: Path) -> None:
    v = classify("bash huge.sh", str(tree), env={}, max_script_bytes=1 << 20, deadline_s=60)
    assert (v.heavy, v.incomplete) == (False, False)


def test_the_depth_limit_stops_a_chain_of_scripts(tree: Path) -> None:
    v = classify("./deep1.sh", str(tree), env={})
    assert (v.heavy, v.incomplete) == (True, True)
    assert "./deep5.sh: scripts nested deeper than 4" in v.why and "deep4.sh line 3" in v.why
    deeper = classify("./deep1.sh", str(tree), env={}, max_depth=6)
    assert (deeper.heavy, deeper.incomplete) == (True, False)
    assert "cargo test [heavy: cargo test] in ./deep6.sh line 2" == deeper.why


def test_the_time_limit_decides_from_what_was_seen(tree: Path) -> None:
    """A deadline already past: nothing more is read; unknown (counted heavy), and said so."""
    v = classify("./scripts/all-tests", str(tree), env={}, deadline_s=0)
    assert (v.heavy, v.incomplete) == (True, True)
    assert "time limit of 0 ms reached" in v.why


def test_the_time_limit_stops_inside_a_long_script() -> None:
    """The parser itself stops at a past deadline (checked every few lines), keeping what it parsed,
    on plain lines and on lines it reads character by character alike."""
    for line in ("echo x\n", "echo 'x' | cat; y=$(z) # c\n"):
        text = line * 50000 + "cargo test\n"
        parsed = parse(text, deadline=0.0)
        assert parsed.stopped and 0 < len(parsed.commands) < 1000
        assert all(c.words[0] != "cargo" for c in parsed.commands)
        full = parse(text)
        assert not full.stopped and full.commands[-1].words == ["cargo", "test"]


def test_huge_command_line_is_fine(tree: Path) -> None:
    v = classify("echo " + "x " * 100000 + "&& cargo test", str(tree), env={}, deadline_s=30)
    assert v.heavy and "cargo test" in v.why


def test_deeply_nested_substitutions_do_not_crash(tree: Path) -> None:
    """Too deep (or too slow) to read to the end: never a crash, and never a pass as light (what
    cannot be read counts heavy)."""
    v = classify("echo " + "$(" * 3000 + "cargo test" + ")" * 3000, str(tree), env={})
    assert v.heavy
    assert "cargo test" in v.why or v.why.startswith("unknown, counted heavy"), v.why
    shallow = classify("echo " + "$(" * 30 + "cargo test" + ")" * 30, str(tree), env={})
    assert shallow.heavy and shallow.why.startswith("cargo test [heavy: cargo test]")


def test_mutually_recursive_scripts_terminate_each_read_once(tree: Path) -> None:
    v = classify("./ping.sh && ./pong.sh && bash ping.sh", str(tree), env={})
    assert v.heavy and "pong.sh line 3" in v.why and not v.incomplete


# -------------------------------------------------------------------- project patterns
def test_project_heavy_pattern(tree: Path) -> None:
    v = classify("./scripts/slow-bench --all", str(tree), env={}, extra_heavy=["./scripts/slow-*"])
    assert v.heavy and "[heavy: ./scripts/slow-*]" in v.why


def test_project_light_pattern_takes_a_default_off(tree: Path) -> None:
    v = classify("cargo check", str(tree), env={}, extra_light=["cargo check"])
    assert not v.heavy and "[light: cargo check]" in v.why
    assert classify("cargo check", str(tree), env={}).heavy


def test_project_heavy_pattern_beats_a_default_light_one(tree: Path) -> None:
    v = classify("cargo fmt", str(tree), env={}, extra_heavy=["cargo fmt"])
    assert v.heavy and "[heavy: cargo fmt]" in v.why


def test_longer_pattern_wins_over_project(tree: Path) -> None:
    """A project's one-word light `cargo` does not beat the default two-word `cargo test`."""
    assert classify("cargo test", str(tree), env={}, extra_light=["cargo"]).heavy
    assert not classify("cargo tree", str(tree), env={}, extra_light=["cargo"]).heavy


def test_help_stays_light_for_project_patterns(tree: Path) -> None:
    v = classify("./scripts/ci --help", str(tree), env={}, extra_heavy=["./scripts/ci"])
    assert not v.heavy and "* --help" in v.why


def test_project_gpu_pattern(tree: Path) -> None:
    v = classify("python3 serve_model.py", str(tree), env={}, extra_gpu=["python* serve_*"])
    assert (v.heavy, v.gpu) == (True, True)


def test_project_pattern_stops_the_script_from_being_read(tree: Path) -> None:
    v = classify("./scripts/all-tests", str(tree), env={}, extra_light=["all-tests"])
    assert not v.heavy and "[light: all-tests]" in v.why


# -------------------------------------------------------------------- environment, argv
def test_inside_a_hostrun_job_everything_runs_through_it(tree: Path) -> None:
    v = classify("cargo test", str(tree), env={"HOSTRUN_JOB": "/sys/fs/cgroup/memory/x"})
    assert (v.heavy, v.through_hostrun) == (True, True) and "$HOSTRUN_JOB" in v.why


def test_tilde_expands_from_env(tree: Path) -> None:
    assert classify("bash ~/run.sh", "/", env={"HOME": str(tree)}).heavy


def test_classify_argv_for_shims(tree: Path) -> None:
    assert classify_argv(["cargo", "test", "--workspace"], str(tree), env={}).heavy
    assert not classify_argv(["cargo", "--version"], str(tree), env={}).heavy
    assert not classify_argv(["cargo", "test", "it's; quoted"], str(tree), env={}).through_hostrun


def test_line_numbers_and_heredoc_bodies() -> None:
    parsed = parse("a\nb <<EOF\nx\ny\nEOF\nc 'multi\nline' && d")
    assert [(c.words[0], c.line) for c in parsed.commands] == [("a", 1), ("b", 2), ("c", 6), ("d", 7)]
    assert parsed.commands[1].stdin_text == "x\ny"


# -------------------------------------------------------------------- cost
def test_importing_and_classifying_a_light_command_stays_light() -> None:
    """No re/json/typing/argparse/sqlite3/pydantic/rich on the path of a light command."""
    code = ("import sys; before = set(sys.modules)\n"
            "from dispatch.hooks.classify import classify\n"
            "classify('cd src && git status && ls | wc -l', '.')\n"
            "print(' '.join(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout.split()
    assert "dispatch.hooks.classify" in out
    assert "dispatch.hooks.scripts" not in out  # read only for a shell, python or a script by path
    heavy = {"re", "json", "typing", "argparse", "sqlite3", "pydantic", "rich", "shlex", "fnmatch"}
    assert sorted(heavy & set(out)) == []


def test_ansi_c_quoting_is_decoded_as_bash_does() -> None:
    assert parse("ca$'r'go b$'\\x75'ild $'a\\tb'").commands[0].words == ["cargo", "build", "a\tb"]


def test_output_redirections_are_recorded_as_writes() -> None:
    (echo, cat) = parse("echo hi > f.sh 2>&1 >> g; cat <<E > t.sh\nx\nE\n").commands
    assert echo.writes == ("f.sh", "g") and cat.writes == ("t.sh",) and cat.stdin_text == "x"
