"""A fake Anthropic Messages API on loopback, for the real Claude Code client (tests/support/
claudeclient.py): ``POST /v1/messages`` answered as a stream of server-sent events, from a script.

The client is pointed at it with ``ANTHROPIC_BASE_URL`` and makes no other traffic
(``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``). Every request is logged (``requests``), so a test
asserts on what the model was sent: the hook's context, a denial's reason, a woken turn's alert.

The script is a list of steps for the main conversation, one per model turn: ``("bash", COMMAND)``
answers with a ``tool_use`` block calling the Bash tool, ``("agent", PROMPT)`` with one starting a
subagent (the client's ``Agent`` tool), ``("text", TEXT)`` with a final text. A step's value may be a
function of what the model was sent so far (``sent_text`` of that request), as a model reads a
refusal and runs the line it gives. Which step a request gets is the number of assistant turns
already in its messages, so a client that retries a request gets the same answer. A subagent's
conversation (its first prompt holds ``SUBAGENT``) follows ``subagent_script`` the same way. A
request past its script, or one without the Bash tool among its tools (a side request), is answered
``"done."``. ``last_answer`` is when the last answer of any request was sent whole (``time.monotonic``),
so a test can tell how long the client took to end after it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Step = tuple[str, "str | Callable[[str], str]"]
SUBAGENT = "SUBAGENT"


class FakeMessagesAPI:
    """Start with ``start()``; ``url`` for ``ANTHROPIC_BASE_URL``; ``stop()`` at the end."""

    def __init__(self, script: list[Step] | None = None) -> None:
        self.script: list[Step] = list(script or [])
        self.subagent_script: list[Step] = []
        self.requests: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.last_answer: float | None = None
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeMessagesAPI:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                with api.lock:
                    api.paths.append("GET " + self.path)
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with api.lock:
                    api.paths.append("POST " + self.path)
                if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
                    data = json.dumps({"input_tokens": 10}).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    with api.lock:
                        api.last_answer = time.monotonic()
                    return
                with api.lock:
                    api.requests.append(body)
                self._stream(body, api.answer(body))

            def _stream(self, body: dict[str, Any], step: Step) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.end_headers()

                def event(name: str, data: dict[str, Any]) -> None:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())

                event("message_start", {"type": "message_start", "message": {
                    "id": f"msg_{len(api.requests)}", "type": "message", "role": "assistant",
                    "model": body.get("model"), "content": [], "stop_reason": None,
                    "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}})
                kind, value = step
                if callable(value):
                    value = value(_text(body.get("messages")))
                if kind in ("bash", "agent"):
                    name, given = (("Bash", {"command": value, "description": "run a command"})
                                   if kind == "bash" else
                                   ("Agent", {"description": "a subagent", "prompt": f"{SUBAGENT}: {value}",
                                              "subagent_type": "general-purpose"}))
                    block = {"type": "tool_use", "id": f"toolu_{len(api.requests):04d}", "name": name,
                             "input": {}}
                    delta = {"type": "input_json_delta", "partial_json": json.dumps(given)}
                    stop = "tool_use"
                else:
                    block, stop = {"type": "text", "text": ""}, "end_turn"
                    delta = {"type": "text_delta", "text": value}
                event("content_block_start", {"type": "content_block_start", "index": 0,
                                              "content_block": block})
                event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
                event("content_block_stop", {"type": "content_block_stop", "index": 0})
                event("message_delta", {"type": "message_delta", "delta": {
                    "stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": 5}})
                event("message_stop", {"type": "message_stop"})
                self.wfile.flush()
                with api.lock:
                    api.last_answer = time.monotonic()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def answer(self, body: dict[str, Any]) -> Step:
        tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        if "Bash" not in tools:
            return ("text", "done.")
        turn = sum(1 for m in body.get("messages") or [] if m.get("role") == "assistant")
        script = self.subagent_script if _is_subagents(body) else self.script
        return script[turn] if turn < len(script) else ("text", "done.")

    def main_requests(self) -> list[dict[str, Any]]:
        """The requests of the main conversation (those offering the Bash tool, not a subagent's)."""
        with self.lock:
            return [r for r in self.requests if not _is_subagents(r)
                    and any(isinstance(t, dict) and t.get("name") == "Bash" for t in r.get("tools") or [])]

    def subagent_text(self) -> str:
        """What the subagent was sent in its last request, as ``sent_text``."""
        with self.lock:
            mine = [r for r in self.requests if _is_subagents(r)]
        return _text(mine[-1].get("messages")) if mine else ""


    def sent_text(self) -> str:
        """Everything the model was sent in the main conversation's last request, as text: user
        prompts, tool results (a command's output, a hook's denial reason) and system reminders."""
        requests = self.main_requests()
        return _text(requests[-1].get("messages")) if requests else ""


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text(v) for v in value)
    if isinstance(value, dict):
        return "\n".join(_text(v) for k, v in value.items() if k in ("content", "text"))
    return ""


def _is_subagents(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or []
    return bool(messages) and f"{SUBAGENT}: " in _text(messages[0]) and not any(
        f"{SUBAGENT}: " in _text(m) for m in messages if m.get("role") == "assistant")
