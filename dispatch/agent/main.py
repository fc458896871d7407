"""What the agent does on the peer (``python3 agent.pyz COMMAND ...``): standard library only.

Commands:
- ``report [--fallback JSON] [--label LABEL] [--peaks]``: the peer's resources, from its own ledger
  and slice (one JSON document on stdout); ``--peaks`` adds its peak table and peak history;
- ``probe --spec JSON``: the job's work directory made ready (and, with ``owner`` in the spec,
  claimed for the controller's session unless already claimed), the tree's toolchain files seeded
  into it, and the toolchain probe outputs taken in the job's directory there;
- ``run``: run one job here, framed; its spec is the first frame on stdin (see ``dispatch.agent.run``);
- ``serve [--idle SECONDS]``: start the report daemon, detached, unless one runs; print where its
  socket is (``dispatch.agent.serve``).

The peer's own configuration (``$HOSTRUN_CONFIG``, ``./hosts.toml`` or
``~/.config/hostrun/hosts.toml``) decides its slice; the controller's ``[hosts.NAME]`` values, passed
as ``--fallback``, fill only what the peer's file leaves unset.
"""

from __future__ import annotations

import json
import sys

from dispatch.agent.prepare import probe


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: agent.pyz report [--fallback JSON] [--label LABEL]", file=sys.stderr)
        return 2
    command = argv[0]
    fallback = json.loads(_option(argv, "--fallback") or "{}")
    if command == "report":
        from dispatch.agent.prepare import agent_report

        json.dump(agent_report(fallback, _option(argv, "--label"), "--peaks" in argv), sys.stdout)
        return 0
    if command == "run":
        from dispatch.agent.frames import read_spec
        from dispatch.agent.run import run_job
        from dispatch.agent.wire import RunSpec

        try:
            spec = RunSpec.from_dict(json.loads(read_spec(0)))
        except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:  # not a controller's
            print(f"agent: no run spec: {exc}", file=sys.stderr)
            return 2
        return run_job(spec)
    if command == "serve":
        from dispatch.agent.serve import serve

        return serve(sys.argv[0], float(_option(argv, "--idle") or 600))
    if command == "probe":
        json.dump(probe(json.loads(_option(argv, "--spec") or "{}")), sys.stdout)
        return 0
    print(f"agent: unknown command {command!r}", file=sys.stderr)
    return 2
