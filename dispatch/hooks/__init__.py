"""Coding-agent integration: classifying shell commands, hook answers, PATH shims."""

from __future__ import annotations

from dispatch.core.faces import lazy_attributes

# What the command line may use of this part (dispatch.core.faces), each loaded when first asked for.
SURFACE: dict[str, str] = {
    "agent_options": "dispatch.hooks.rewrite",
    "agents_main": "dispatch.hooks.install:main",
    "classify_argv": "dispatch.hooks.classify",
    "find_real": "dispatch.hooks.shimpath",
    "hook_main": "dispatch.hooks.claude:main",
}
__all__ = ["agent_options", "agents_main", "classify_argv", "find_real", "hook_main"]
MYPY = False
if MYPY:
    from dispatch.hooks.classify import classify_argv as classify_argv
    from dispatch.hooks.claude import main as hook_main
    from dispatch.hooks.install import main as agents_main
    from dispatch.hooks.rewrite import agent_options as agent_options
    from dispatch.hooks.shimpath import find_real as find_real

__getattr__ = lazy_attributes(__name__, SURFACE)
