"""A FAKE rustup for toolchain tests (no rustup is installed on these machines).

It behaves as rustup's proxies do where hostrun's toolchain check is concerned: ``bin/rustc`` is one
shell script that never changes; it picks the toolchain from ``$RUSTUP_TOOLCHAIN``, else the nearest
``rust-toolchain.toml`` (its ``channel``) or ``rust-toolchain`` walking up from the current
directory, else ``default_toolchain`` in ``$RUSTUP_HOME/settings.toml``, and execs
``$RUSTUP_HOME/toolchains/NAME/bin/rustc`` — or fails as rustup does when that toolchain is not
installed. Each toolchain's ``rustc`` prints its version lines.
"""

from __future__ import annotations

from pathlib import Path

PROXY = r"""#!/bin/sh
home=${RUSTUP_HOME:-$HOME/.rustup}
tc=$RUSTUP_TOOLCHAIN
if [ -z "$tc" ]; then
  d=$(pwd -P)
  while :; do
    if [ -f "$d/rust-toolchain.toml" ]; then
      tc=$(sed -n 's/^channel *= *"\(.*\)".*/\1/p' "$d/rust-toolchain.toml"); break
    fi
    if [ -f "$d/rust-toolchain" ]; then tc=$(head -n 1 "$d/rust-toolchain"); break; fi
    [ "$d" = / ] && break
    d=$(dirname "$d")
  done
fi
[ -n "$tc" ] || tc=$(sed -n 's/^default_toolchain *= *"\(.*\)".*/\1/p' "$home/settings.toml")
bin="$home/toolchains/$tc/bin/$(basename "$0")"
if [ ! -x "$bin" ]; then
  echo "error: toolchain '$tc' is not installed" >&2
  exit 1
fi
[ -n "$FAKE_RUSTUP_LOG" ] && echo "$tc" >> "$FAKE_RUSTUP_LOG"
exec "$bin" "$@"
"""


class FakeRustup:
    """``home`` is RUSTUP_HOME; ``bin`` holds the proxy (put it first on PATH)."""

    def __init__(self, root: Path, default: str, toolchains: dict[str, str]) -> None:
        self.home = root / "rustup"
        self.bin = root / "cargo-bin"
        self.bin.mkdir(parents=True)
        (self.bin / "rustc").write_text(PROXY)
        (self.bin / "rustc").chmod(0o755)
        for name, version in toolchains.items():
            self.install(name, version)
        self.set_default(default)

    def install(self, name: str, version: str) -> None:
        directory = self.home / "toolchains" / name / "bin"
        directory.mkdir(parents=True)
        (directory / "rustc").write_text(f"#!/bin/sh\necho '{version}'\necho 'host: x86_64-fake'\n")
        (directory / "rustc").chmod(0o755)

    def set_default(self, name: str) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "settings.toml").write_text(f'version = "12"\ndefault_toolchain = "{name}"\n')

    def env(self, path: str) -> dict[str, str]:
        return {"PATH": f"{self.bin}:{path}", "RUSTUP_HOME": str(self.home)}
