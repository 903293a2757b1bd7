"""A real HTTP server on loopback that speaks the OpenAI Chat Completions protocol (and Anthropic Messages).

Not a mock of any SDK: the adapters talk to it over TCP exactly as they
talk to a provider, and worker subprocesses reach it through
``LLM_BASE_URL``. Each test scripts it: queued replies are served first
(failure injection: HTTP errors with headers, hangs, malformed tool calls),
then a "brain" answers from the conversation in the request. A request
with ``"stream": true`` is answered as server-sent chunks (the text a few
words a chunk, tool call arguments in pieces), errors as JSON. Every request
body is recorded, and every usage it reported is kept, so tests can count
model calls and check what the model was sent and what it was charged.

Test modules load its fixtures with ``pytest_plugins = ["tests.support.fake_openai"]``
after importing its helpers, so it asks not to be assertion-rewritten
(it asserts nothing): PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runs.models import Run
from tests.support.waiting import wait_until
from workers.llm.providers import to_assistant_message
from workers.worker import Worker, WorkerOptions

MODEL = "fake-model"
# Dollars per million tokens, set as RUNS_LLM_PRICES by the fixture.
PRICES = {MODEL: {"input": 2.0, "output": 8.0}}


@dataclass
class Reply:
    """One scripted answer. ``message`` (an assistant message) makes a completion; else ``error``."""

    status: int = 200
    message: dict | None = None
    error: str = ""
    headers: dict = field(default_factory=dict)
    hang: float = 0.0  # seconds to stall before answering
    usage: tuple[int, int] | None = (
        None  # (prompt, completion) tokens; estimated from the bodies if None
    )


def say(
    content: str | None = None, *calls: tuple[str, dict | str], usage: tuple[int, int] | None = None
) -> Reply:
    """An answer with text and/or tool calls ``(name, arguments)``; string arguments are sent verbatim."""
    reply = {"content": content, "tool_calls": [{"name": n, "arguments": a} for n, a in calls]}
    return Reply(message=reply, usage=usage)


def fail(status: int, message: str = "injected failure", **headers: str) -> Reply:
    return Reply(
        status=status, error=message, headers={k.replace("_", "-"): v for k, v in headers.items()}
    )


def hang(seconds: float) -> Reply:
    """Stall ``seconds`` (or until the server stops), then answer a plain text (to a client long gone)."""
    return Reply(hang=seconds, message={"content": "late"})


def turn(messages: list[dict]) -> int:
    """Which model call of the run this request is (1 for the first)."""
    return 1 + sum(1 for m in messages if m.get("role") == "assistant")


def from_script(script: Callable[[list[dict], list[dict]], dict]) -> Callable[[dict], Reply]:
    """A brain that answers as ``script`` (a scripted-model script) would, over the wire."""

    def brain(body: dict) -> Reply:
        return Reply(message=script(body["messages"], body.get("tools") or []))

    return brain


class FakeOpenAI:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.usage: list[tuple[int, int]] = []
        self.queue: deque[Reply] = deque()
        self.brain: Callable[[dict], Reply] | None = None
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="fake-openai", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def bodies(self) -> list[dict]:
        with self.lock:
            return [r["body"] for r in self.requests]

    def start(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def enqueue(self, *replies: Reply) -> None:
        with self.lock:
            self.queue.extend(replies)

    def next_reply(self, path: str, body: dict, headers: dict) -> Reply:
        with self.lock:
            self.requests.append(
                {"path": path, "body": body, "headers": headers, "at": time.time()}
            )
            if self.queue:
                return self.queue.popleft()
        messages = (
            _openai_messages(body) if path.endswith("/messages") else body.get("messages", [])
        )
        if self.brain is not None:
            return self.brain({**body, "messages": messages, "tools": _openai_tools(body)})
        return say("Nothing to do.")

    def charge(self, reply: Reply, body: dict, message: dict) -> tuple[int, int]:
        usage = reply.usage or (len(json.dumps(body)) // 4, 5 + len(json.dumps(message)) // 4)
        with self.lock:
            self.usage.append(usage)
        return usage


def _handler(fake: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # quiet
            pass

        def do_POST(self):
            body = json.loads(
                self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}"
            )
            anthropic = self.path.endswith("/messages")
            reply = fake.next_reply(self.path, body, dict(self.headers))
            if reply.hang:
                fake.released.wait(reply.hang)
            if reply.message is None:
                payload = {
                    "error": {"message": reply.error, "type": "injected", "code": reply.status}
                }
                if anthropic:
                    payload = {
                        "type": "error",
                        "error": {"type": "injected", "message": reply.error},
                    }
                return self._send(reply.status, payload, reply.headers)
            n = turn(_openai_messages(body) if anthropic else body.get("messages", []))
            message = to_assistant_message(reply.message, turn=n)
            if reply.message.get("refusal"):
                message["refusal"] = reply.message["refusal"]
            usage = fake.charge(reply, body, message)
            if body.get("stream") and not anthropic:
                return self._stream(_openai_chunks(body, message, usage), reply.headers)
            payload = (
                _anthropic_answer(body, message, usage)
                if anthropic
                else _openai_answer(body, message, usage)
            )
            self._send(200, payload, reply.headers)

        def _stream(self, chunks: list[dict], headers: dict) -> None:
            """Server-sent events, one HTTP chunk each, flushed as they go."""
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                for event in [*(json.dumps(chunk) for chunk in chunks), "[DONE]"]:
                    data = f"data: {event}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _send(self, status: int, payload: dict, headers: dict) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a hang it timed out on)

    return Handler


def _openai_answer(body: dict, message: dict, usage: tuple[int, int]) -> dict:
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", MODEL),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        },
    }


def _openai_chunks(body: dict, message: dict, usage: tuple[int, int]) -> list[dict]:
    """The answer as a stream's ``chat.completion.chunk`` objects: the text a few words a chunk, each tool
    call's id and name first and then its arguments in pieces, the finish, and the usage if it was asked for."""
    base = {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", MODEL),
    }
    with_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(delta: dict, finish_reason: str | None = None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**base, "choices": [choice], **({"usage": None} if with_usage else {})}

    content = message.get("content")
    chunks = [chunk({"role": "assistant", "content": "" if content is not None else None})]
    words = re.split(r"(?<=\s)(?=\S)", content or "")
    chunks += [
        chunk({"content": "".join(words[i : i + 2])}) for i in range(0, len(words), 2) if content
    ]
    if message.get("refusal"):
        chunks.append(chunk({"refusal": message["refusal"]}))
    for index, call in enumerate(message.get("tool_calls") or []):
        first = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [first]}))
        arguments = call["function"]["arguments"]
        for start in range(0, len(arguments), 7):
            piece = {"index": index, "function": {"arguments": arguments[start : start + 7]}}
            chunks.append(chunk({"tool_calls": [piece]}))
    chunks.append(chunk({}, "tool_calls" if message.get("tool_calls") else "stop"))
    if with_usage:
        chunks.append(
            {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": usage[0],
                    "completion_tokens": usage[1],
                    "total_tokens": sum(usage),
                },
            }
        )
    return chunks


def _anthropic_answer(body: dict, message: dict, usage: tuple[int, int]) -> dict:
    content: list[dict] = (
        [{"type": "text", "text": message["content"]}] if message.get("content") else []
    )
    for call in message.get("tool_calls") or []:
        content.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["function"]["name"],
                "input": json.loads(call["function"]["arguments"]),
            }
        )
    return {
        "id": f"msg_{time.monotonic_ns()}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": content,
        "stop_reason": "tool_use" if message.get("tool_calls") else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def _openai_messages(body: dict) -> list[dict]:
    """A Messages API request's conversation in Chat Completions form (for brains and turn counting)."""
    if "system" not in body and all(
        isinstance(m.get("content"), str) for m in body.get("messages", [])
    ):
        return body.get("messages", [])
    messages = [{"role": "system", "content": body["system"]}] if body.get("system") else []
    for turn_ in body.get("messages", []):
        blocks = (
            turn_["content"]
            if isinstance(turn_["content"], list)
            else [{"type": "text", "text": turn_["content"]}]
        )
        if turn_["role"] == "assistant":
            text = "\n".join(b["text"] for b in blocks if b["type"] == "text") or None
            calls = [
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": json.dumps(b["input"])},
                }
                for b in blocks
                if b["type"] == "tool_use"
            ]
            messages.append(
                {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}
            )
            continue
        for block in blocks:
            if block["type"] == "tool_result":
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": block["tool_use_id"],
                        "content": block["content"],
                    }
                )
            elif block["type"] == "text":
                messages.append({"role": "user", "content": block["text"]})
    return messages


def _openai_tools(body: dict) -> list[dict]:
    return [
        t
        if "function" in t
        else {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
        for t in body.get("tools") or []
    ]


@pytest.fixture
def fake_llm(settings):
    """The fake provider, configured as this process's LLM (workers started by the test get ``llm_env``)."""
    fake = FakeOpenAI().start()
    settings.LLM_BASE_URL = fake.url
    settings.LLM_API_KEY = "sk-test"
    settings.LLM_MODEL = MODEL
    settings.LLM_PROVIDER = ""
    settings.RUNS_LLM_PRICES = PRICES
    fake.env = {
        "LLM_BASE_URL": fake.url,
        "LLM_API_KEY": "sk-test",
        "LLM_MODEL": MODEL,
        "LLM_PROVIDER": "",
        "RUNS_LLM_PRICES": json.dumps(PRICES),
    }
    yield fake
    fake.stop()


@pytest.fixture
def offline(settings):
    """No provider configured: the scripted model drives the built-in kinds."""
    settings.LLM_BASE_URL = ""
    settings.LLM_PROVIDER = ""
    settings.RUNS_DEMO_DELAY_SCALE = 0


def burst_worker(**options) -> None:
    """An in-process worker that exits once nothing is claimable."""
    options = {
        "burst": True,
        "heartbeat": 1,
        "lease": 10,
        "listen": False,
        "concurrency": 2,
    } | options
    Worker(WorkerOptions(**options)).run()


def drive(
    *runs: Run,
    until: tuple[str, ...] = ("done", "failed", "waiting_human", "cancelled"),
    timeout: float = 30,
) -> list[Run]:
    """Run burst workers (waiting out backoffs) until every run reached one of ``until``."""
    seen: list[Run] = []

    def reached() -> bool:
        burst_worker()
        seen[:] = [Run.objects.get(pk=run.pk) for run in runs]
        return all(run.status in until for run in seen)

    wait_until(
        reached,
        timeout=timeout,
        what=lambda: f"runs in {until}; they are {[(r.status, r.error) for r in seen]}",
    )
    return seen
