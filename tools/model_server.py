"""A scripted OpenAI-compatible chat-completions server: the tests' model provider and the
offline model of the local stack (``tools.model_stub``).

A real HTTP server in a daemon thread: the service reaches it through the real ``openai`` client,
tests queue its answers with :meth:`ModelServer.script` and read what it received from
:attr:`ModelServer.requests`. Requests are matched to scripts by their ``X-Botmemory-Task`` header.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import socketserver
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, cast

TASK_HEADER = "X-Botmemory-Task"
CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
DEFAULT_REPLY_TEXT = "Thank you for telling me."


@dataclass
class ToolCall:
    """One tool call of a reply; a ``str`` as arguments is sent verbatim (may be malformed JSON)."""

    name: str
    arguments: dict[str, Any] | str
    id: str | None = None


@dataclass
class Reply:
    """One scripted answer; ``usage`` is (prompt_tokens, completion_tokens) or None for no usage."""

    text: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list[ToolCall])
    usage: tuple[int, int] | None = (10, 5)
    delay: float = 0.0
    hold: threading.Event | None = None  # when given, the answer waits until the test sets it
    #: When given, a streamed answer sends its first piece of text, then waits until the test sets it.
    midway: threading.Event | None = None
    #: When given, a streamed answer sends its first piece of text, then breaks off: "cut" closes
    #: the connection (no finish reason, no [DONE]); "error" sends an error event, as servers do
    #: when generation fails midway.
    broken: Literal["cut", "error"] | None = None
    status: int = 200
    body: bytes | None = None
    model: str | None = None


@dataclass
class Recorded:
    """One received chat-completions request."""

    task: str | None
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float

    @functools.cached_property
    def text(self) -> str:
        """The body as JSON text (what a reply bound to a text is matched against)."""
        return json.dumps(self.body, ensure_ascii=False)


class ModelServer:
    """Serves scripted replies on ``/v1/chat/completions`` and records every request to it.

    Other paths get a JSON 404 and a body that is not a JSON object a 400; neither is recorded.
    """

    def __init__(self, history: int | None = None) -> None:
        """``history`` bounds the record to the last requests (a long-running server); None keeps all."""
        self._lock = threading.Lock()
        self._queues: dict[tuple[str | None, str | None], deque[Reply]] = {}
        self._defaults: dict[str | None, Reply] = {}
        self._responders: dict[str | None, Callable[[Recorded], Reply]] = {}
        self._record: deque[Recorded] = deque(maxlen=history)
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self, port: int = 0) -> ModelServer:
        """Bind 127.0.0.1 on ``port`` (0: a free one) and serve in a daemon thread."""
        assert self._httpd is None, "already started"
        self._stopping.clear()
        self._httpd = _HTTPServer(self._take, self._next_id, self._stopping, port)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="model-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; replies still sleeping in their delay are cut short."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def script(self, task: str | None, *replies: Reply, about: str | None = None) -> None:
        """Queue replies for requests whose X-Botmemory-Task header equals task (None = any task);
        consumed in order; task-specific queues are tried before the any-task queue. With
        ``about``, only requests whose body contains that text take them (before the queues
        without it): a test's replies are not taken by another test's work still in flight, such
        as a Turn the sweeper queues once it is idle."""
        with self._lock:
            self._queues.setdefault((task, about), deque()).extend(replies)

    def default(self, task: str | None, reply: Reply) -> None:
        """The reply used when no queued reply matches (built-in default: Reply(text="Thank you for telling me."))."""
        with self._lock:
            self._defaults[task] = reply

    def respond(self, task: str | None, responder: Callable[[Recorded], Reply]) -> None:
        """Compute the reply of a task's requests from the request itself (after its queue, before
        defaults): a scripted model that can cite the ids it was sent. ``None``: every request
        that no task-specific responder answers."""
        with self._lock:
            self._responders[task] = responder

    @property
    def requests(self) -> list[Recorded]:
        """A copy of the recorded requests, in arrival order."""
        with self._lock:
            return list(self._record)

    def requests_for(self, task: str) -> list[Recorded]:
        """The recorded requests of one task, in arrival order."""
        return [r for r in self.requests if r.task == task]

    def reset(self) -> None:
        """Clear the queues, the defaults and the record."""
        with self._lock:
            self._queues.clear()
            self._defaults.clear()
            self._responders.clear()
            self._record.clear()

    async def wait_for_requests(  # the API takes a timeout; it bounds polling, not one await
        self,
        task: str | None,
        count: int,
        timeout: float = 10,  # noqa: ASYNC109
    ) -> list[Recorded]:
        """Poll until at least count requests of task (None = any task) are recorded; return them."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.requests if task is None else self.requests_for(task)
            if len(found) >= count:
                return found
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"model server: {len(found)} of {count} requests for task {task!r} after {timeout}s; "
                    f"received tasks: {[r.task for r in self.requests]}"
                )
            await asyncio.sleep(0.02)

    # Called from the handler threads.

    def _take(self, recorded: Recorded) -> Reply:
        """Record the request and pick its reply."""
        task = recorded.task
        with self._lock:
            self._record.append(recorded)
            for key in (task, None) if task is not None else (None,):
                for (of, about), queue in self._queues.items():
                    if of == key and about is not None and queue and about in recorded.text:
                        return queue.popleft()
                queue = self._queues.get((key, None))
                if queue:
                    return queue.popleft()
            responder = self._responders.get(task) or self._responders.get(None)
        if responder is not None:
            return responder(recorded)
        with self._lock:
            if task is not None and task in self._defaults:
                return self._defaults[task]
            return self._defaults.get(None, Reply(text=DEFAULT_REPLY_TEXT))

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            return f"{prefix}{next(self._ids)}"


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        take: Callable[[Recorded], Reply],
        next_id: Callable[[str], str],
        stopping: threading.Event,
        port: int,
    ) -> None:
        self.take = take
        self.next_id = next_id
        self.stopping = stopping
        super().__init__(("127.0.0.1", port), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host name (getfqdn), which can hang without DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name = "127.0.0.1"
        self.server_port = int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client gave up (e.g. its timeout)
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection; the stream ends when the socket closes

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        with contextlib.suppress(ConnectionError):  # BrokenPipe / ConnectionReset: the client gave up
            self._chat()

    def do_GET(self) -> None:
        self._send_error(404, "not found", "invalid_request_error")

    def _chat(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in CHAT_PATHS:
            self._send_error(404, f"no route {path}", "invalid_request_error")
            return
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            parsed: Any = json.loads(raw or b"null")
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            self._send_error(400, "request body is not a JSON object", "invalid_request_error")
            return
        body = cast("dict[str, Any]", parsed)
        server = cast("_HTTPServer", self.server)
        headers = {name.lower(): value for name, value in self.headers.items()}
        reply = server.take(Recorded(headers.get(TASK_HEADER.lower()), path, headers, body, time.monotonic()))
        if reply.delay > 0 and server.stopping.wait(reply.delay):
            return  # the server is stopping
        while reply.hold is not None and not reply.hold.wait(0.05):
            if server.stopping.is_set():
                return
        if reply.body is not None:
            self._send(reply.status, reply.body)
        elif reply.status != 200:
            self._send_error(reply.status, "scripted error", "server_error")
        elif body.get("stream") is True:
            self._stream(server.next_id, reply, body)
        else:
            self._send(200, json.dumps(_completion(server.next_id, reply, body)).encode())

    def _send(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(payload)

    def _send_error(self, status: int, message: str, kind: str) -> None:
        error = {"error": {"message": message, "type": kind, "code": None}}
        self._send(status, json.dumps(error).encode())

    def _stream(self, next_id: Callable[[str], str], reply: Reply, body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        server = cast("_HTTPServer", self.server)
        for at, chunk in enumerate(_chunks(next_id, reply, body)):
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if at == 1 and reply.midway is not None:  # the role, then the first piece of text
                self.wfile.flush()
                while not reply.midway.wait(0.05):
                    if server.stopping.is_set():
                        return
            if at == 1 and reply.broken == "cut":
                return
            if at == 1 and reply.broken == "error":
                error = {"error": {"message": "generation failed", "type": "server_error", "code": None}}
                self.wfile.write(b"data: " + json.dumps(error).encode() + b"\n\n")
                return
        self.wfile.write(b"data: [DONE]\n\n")


def _tool_calls(next_id: Callable[[str], str], reply: Reply) -> list[dict[str, Any]]:
    return [
        {
            "id": call.id or next_id("call_"),
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": call.arguments
                if isinstance(call.arguments, str)
                else json.dumps(call.arguments),
            },
        }
        for call in reply.tool_calls
    ]


def _usage(usage: tuple[int, int]) -> dict[str, int]:
    prompt, completion = usage
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _head(next_id: Callable[[str], str], reply: Reply, body: dict[str, Any], kind: str) -> dict[str, Any]:
    return {
        "id": next_id("chatcmpl-"),
        "object": kind,
        "created": int(time.time()),
        "model": reply.model or str(body.get("model") or "scripted-model"),
    }


def _completion(next_id: Callable[[str], str], reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    calls = _tool_calls(next_id, reply)
    if calls:
        message["tool_calls"] = calls
    result = _head(next_id, reply, body, "chat.completion")
    result["choices"] = [
        {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop", "logprobs": None}
    ]
    if reply.usage is not None:
        result["usage"] = _usage(reply.usage)
    return result


def _split(text: str, parts: int) -> list[str]:
    """text in exactly ``parts`` pieces (some may be empty when text is short)."""
    cuts = [round(i * len(text) / parts) for i in range(parts + 1)]
    return [text[a:b] for a, b in itertools.pairwise(cuts)]


def _chunks(next_id: Callable[[str], str], reply: Reply, body: dict[str, Any]) -> list[dict[str, Any]]:
    head = _head(next_id, reply, body, "chat.completion.chunk")

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    chunks = [chunk({"role": "assistant", "content": "" if reply.text is not None else None})]
    if reply.text is not None:
        chunks += [
            chunk({"content": piece}) for piece in _split(reply.text, 3 if len(reply.text) >= 3 else 2)
        ]
    calls = _tool_calls(next_id, reply)
    for index, call in enumerate(calls):
        function = call["function"]
        start = {"index": index, "id": call["id"], "type": "function"}
        chunks.append(
            chunk({"tool_calls": [{**start, "function": {"name": function["name"], "arguments": ""}}]})
        )
        for piece in _split(function["arguments"], 2):
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, "tool_calls" if calls else "stop"))
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and cast("dict[str, Any]", options).get("include_usage") is True
    if include_usage and reply.usage is not None:
        chunks.append({**head, "choices": [], "usage": _usage(reply.usage)})
    return chunks
