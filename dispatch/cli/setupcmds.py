"""The commands that set things up: ``shims``, ``shared`` (a shared slice for several users),
``hook`` and ``agents`` (coding agents' hooks)."""

from __future__ import annotations

import os

from dispatch.cli.common import print_lines, say, subaction
from dispatch.core import cap_size


def cmd_shims(argv: list[str]) -> int:
    """``hostrun shims install|uninstall|list DIR``: PATH wrappers that route heavy tool runs."""
    from dispatch.hooks import shims

    picked = subaction("shims", argv, {
        "install": "Write a wrapper per tool into DIR: a heavy invocation runs through hostrun, a light "
                   "one runs the real tool (found further along PATH) directly.",
        "uninstall": "Remove hostrun's wrappers from DIR (files hostrun did not write are kept).",
        "list": "hostrun's wrappers in DIR, and the real tool each would run now.",
    }, "DIR ...", "PATH shims for agents and scripts without hooks (docs/agents.md)", (
        "install DIR [--tools a,b]   write a wrapper per tool in DIR (put DIR first on PATH)",
        "uninstall DIR               remove hostrun's wrappers from DIR, nothing else",
        "list DIR [--json]           hostrun's wrappers in DIR and the tool each one runs"),
        json_for=("list",))
    if picked is None:
        return 0
    action, p, rest = picked
    p.add_argument("dir", metavar="DIR")
    if action == "install":
        p.add_argument("--tools", metavar="A,B,...",
                       help=f"the tools to wrap (default: {','.join(shims.DEFAULT_TOOLS)})")
    args = p.parse_args(rest)
    if action == "install":
        tools = shims.parse_tools(args.tools)
        print_lines([f"installed {path}" for path in shims.install(args.dir, tools)])
        say(f"put {os.path.abspath(args.dir)} first on PATH (export PATH={os.path.abspath(args.dir)}"
            ":$PATH) for the commands that should go through hostrun")
        return 0
    if action == "uninstall":
        print_lines([f"removed {path}" for path in shims.uninstall(args.dir)])
        return 0
    found = shims.listing(args.dir)
    if args.json:
        import json

        print(json.dumps(found, indent=2))
    else:
        print_lines([f"{row['tool']}: {row['path']} -> {row['real'] or 'no real tool on PATH'}"
                     for row in found])
    return 0


def cmd_shared(argv: list[str]) -> int:
    """``hostrun shared status|install|uninstall``: one slice and one queue for a group of users."""
    picked = subaction("shared", argv, {
        "status": "Every user's bookings on this machine's shared slice.",
        "install": "As root: set up a shared slice for a group (a socket unit and its root daemon).",
        "uninstall": "As root: stop the shared slice's daemon (its running jobs are killed) and "
                     "remove its units.",
    }, "...", "A shared slice for several users (docs/backends.md#several-users-one-machine)", (
        "status [--json]                      every user's bookings on the shared slice",
        "install --group G --size SIZE        as root: one slice of SIZE for the members of G",
        "uninstall                            as root: stop the daemon, remove its units"),
        json_for=("status",))
    if picked is None:
        return 0
    action, p, rest = picked
    if action == "install":
        p.add_argument("--group", required=True, help="the group whose members share the slice")
        p.add_argument("--size", required=True, type=cap_size,
                       help="the slice's memory limit (e.g. 24G)")
        p.add_argument("--slice", default="hostrun.slice", help="the slice unit (default: %(default)s)")
    args = p.parse_args(rest)
    if action == "install":
        from dispatch.local import install

        install(args.group, args.size, args.slice, say)
        return 0
    if action == "uninstall":
        from dispatch.local import uninstall

        uninstall(say)
        return 0
    from dispatch.capping import listing, listing_lines

    data = listing()
    if args.json:
        import json

        print(json.dumps(data, indent=2))
    else:
        print_lines(listing_lines(data))
    return 0


def cmd_hook(argv: list[str]) -> int:
    """``hostrun hook EVENT``: a coding agent's hook (dispatch.hooks.claude); always exits 0."""
    from dispatch.hooks import hook_main

    return hook_main(argv)


def cmd_agents(argv: list[str]) -> int:
    """``hostrun agents install|uninstall|status``: the hooks in Claude Code's settings."""
    from dispatch.hooks import agents_main

    return agents_main(argv, say)
