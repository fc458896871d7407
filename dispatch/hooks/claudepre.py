"""PreToolUse (matcher ``Bash``): classify the command an agent is about to run and answer by the mode.

A light command gets no answer at all: that is the path of nearly every call, so it loads the
classifier and the config from its cache and nothing more (docs/design.md, "The hot path stays
light"). A heavy or GPU one gets the resource table and, by the mode (``[agents] mode`` or
``--mode``): ``remind`` the table alone; ``wrap`` the command rewritten to run through hostrun, with
the decision the user's own permission rules would give the original; ``guard`` a refusal with the
exact command to run instead, unless a person's scope declaration is in front of it (never inside a
subagent). A subagent's whole test suite is refused in every mode (``[agents] subagent_suite``).
"""

from __future__ import annotations

from dispatch.hooks.claudeconfig import hook_settings, problem_answer, project_root
from dispatch.hooks.claudeevent import PRE_TOOL_USE, answer, event_cwd, note, short

MYPY = False
if MYPY:
    from typing import Any, TextIO

    from dispatch.core.settings import Settings
    from dispatch.hooks.classify import Classification
    from dispatch.hooks.claudeevent import HookArgs
    from dispatch.hooks.hookshape import HookAnswer, HookEvent, ToolInput

MAX_ECHO = 2000  # characters of a command repeated in a denial (a 10 MB command gave a 10 MB answer)


def pre_tool_use(data: HookEvent, args: HookArgs, err: TextIO) -> HookAnswer | None:
    """The answer to a ``Bash`` tool call: none for a light command."""
    if data.get("tool_name") != "Bash":
        note(f"tool {data.get('tool_name')!r} is not Bash: nothing to do", err)
        return None
    tool_input = data.get("tool_input")
    command = tool_input.get("command") if isinstance(tool_input, dict) else None
    if not isinstance(command, str) or not command.strip():
        note("no tool_input.command in the event: nothing to do", err)
        return None
    settings = hook_settings(args, err, data)
    if settings is None:
        return problem_answer(args)
    agents = settings.agents
    cwd = event_cwd(data)
    from dispatch.hooks.classify import classify

    verdict = classify(command, cwd, extra_heavy=agents.heavy, extra_light=agents.light,
                       extra_gpu=agents.gpu)
    if not (verdict.heavy or verdict.gpu):
        return None  # light: no answer, the command runs as it is
    if data.get("agent_id") and agents.subagent_suite == "refuse":
        from dispatch.hooks.scope import full_suite

        suite = full_suite(command)
        if suite is not None:
            return answer(PRE_TOOL_USE, permissionDecision="deny", permissionDecisionReason=(
                f"hostrun: refused: `{short(suite)}` runs the whole test suite, which is the main "
                "agent's to run (one at a time, with the machine in view), through hostrun or not. "
                "Run the tests of what you changed (e.g. `cargo test -p CRATE`, `pytest "
                "tests/test_x.py`, `-k NAME`), or report back and let the main agent run the suite."))
    return _heavy(data, args, settings, command, cwd, verdict)


def _heavy(data: HookEvent, args: HookArgs, settings: Settings, command: str, cwd: str,
           verdict: Classification) -> HookAnswer:
    """A heavy or GPU command: the table, and by the mode the table alone, a rewrite or a refusal."""
    from dispatch.hooks import rewrite
    from dispatch.hooks.session import claude_session

    mode = args.mode or settings.agents.mode
    session = claude_session(data.get("session_id"))
    direct = not verdict.through_hostrun
    label = rewrite.derive_label(verdict.why, cwd) if direct and mode != "remind" else None
    readings, table_text = _table(settings, label)
    context = [f"hostrun: this command is heavy: {verdict.why}.", table_text]
    if not direct or mode == "remind":
        return answer(PRE_TOOL_USE, additionalContext="\n".join(context))
    from dispatch.hooks import table

    cap = rewrite.half_rule_cap(table.label_peak(settings, readings),
                                table.slice_limit(settings, readings))
    from dispatch.core.hostfacts import has_nvidia_gpus

    gpu = verdict.gpu and has_nvidia_gpus()
    instead = rewrite.wrapped(command, rewrite.hostrun_argv(args.config), session, label, cap, gpu)
    if mode == "wrap":
        return _wrap(data, command, verdict, context, instead)
    return _guard(data, settings, command, verdict, context, instead)


def _wrap(data: HookEvent, command: str, verdict: Classification, context: list[str], instead: str
          ) -> HookAnswer:
    """``wrap``: the command rewritten to ``instead``, decided as the user's own rules would have
    decided the original (dispatch.hooks.permissions): allowed runs without a prompt, would-prompt
    prompts, would-be-refused is left as it is."""
    from dispatch.hooks.permissions import decide

    decision = decide(command, data.get("permission_mode"), project_root(data))
    if decision == "leave":
        context.insert(1, "hostrun wrap: not rewritten: your permission rules or mode decide "
                          f"this command as it is; to cap it, run: {instead}")
        return answer(PRE_TOOL_USE, additionalContext="\n".join(context))
    # Each line must read right as a prompt and as a refusal: headless (claude -p, dontAsk) an
    # ``ask`` becomes a denial whose only text is this reason, so nothing here may say it ran.
    context.insert(1, f"hostrun wrap: rewritten to run through hostrun; if it is allowed, it runs "
                      f"as: {instead}")
    tool_input: ToolInput = {**data["tool_input"], "command": instead}  # the tool's other keys kept
    reason = (f"hostrun wrap: heavy ({verdict.why}); if you allow it, it runs through hostrun, "
              f"under a memory cap and booked in hostrun's ledger, as: {instead}")
    if decision == "ask":
        reason += " (if it was refused, nothing ran)"
    return answer(PRE_TOOL_USE, permissionDecision=decision, permissionDecisionReason=reason,
                  updatedInput=tool_input, additionalContext="\n".join(context))


def _guard(data: HookEvent, settings: Settings, command: str, verdict: Classification,
           context: list[str], instead: str) -> HookAnswer:
    """``guard``: refused with ``instead`` to run, unless a person declared its scope in front of
    it (``[agents] escape_env``; never inside a subagent)."""
    subagent = bool(data.get("agent_id"))
    escape = settings.agents.escape_env
    from dispatch.hooks import rewrite
    from dispatch.hooks.scope import declaration, kind_of, problems

    reason = rewrite.escape_reason(command, escape)
    decl = declaration(reason) if reason is not None else None
    lacking = problems(decl, kind_of(verdict.why), settings.agents.escape_min) if decl else []
    if decl is not None and not subagent and not lacking:
        said = "; ".join(f"{k}={decl.fields[k]}" for k in ("kind", "target", "extent", "reason"))
        return answer(PRE_TOOL_USE, additionalContext="\n".join(
            [f"hostrun guard: direct run let through, as declared ({short(said, 400)})", *context[1:]]))
    shown = instead if len(instead) <= MAX_ECHO else (
        f"{instead[:MAX_ECHO]}… ({len(instead)} characters in all, not repeated here: the same with "
        "your whole command inside `bash -c '…'`)")
    why = [f"hostrun guard: refused: `{short(command)}` is heavy ({short(verdict.why)}) and would "
           "run outside hostrun's memory cap. Run it through hostrun instead:", shown]
    if subagent:
        why.append("(Inside a subagent heavy work always runs through hostrun.)")
    elif decl is not None:
        why.append(f"({escape} was given, but its scope declaration has {', '.join(lacking)}: a "
                   "direct run declares kind, target, extent and reason.)")
    return answer(PRE_TOOL_USE, permissionDecision="deny", permissionDecisionReason="\n".join(why),
                  additionalContext="\n".join(context[1:]))


def _table(settings: Settings, label: str | None) -> tuple[list[Any], str]:
    """Every host's reading and the table's text (a failure to read is said, not raised)."""
    from dispatch.core.errors import HostrunError
    from dispatch.hooks import table

    try:
        readings = table.read(settings, label)
    except (HostrunError, OSError) as exc:
        return [], f"hostrun resources: could not read: {exc}"
    peers = settings.enable_across_machines and len(settings.hosts) > 1
    return readings, table.text(settings, readings, peers)
