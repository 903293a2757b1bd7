"""The error classifier against real exceptions from real clients, talking to a real server on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import httpx
import openai
import pydantic
import pytest
import requests

from workers.classify import classify
from workers.errors import Ambiguous, Fatal, Retryable

ROOT = Path(__file__).resolve().parents[2]
CLIENT_TIMEOUT = 0.5  # seconds; the "slow" path answers far later than this

# Path segment -> (status, extra headers) for the paths that answer with an error.
ERROR_ANSWERS = {
    "429": (429, {"Retry-After": "7"}),
    "503": (503, {}),
    "500": (500, {"retry-after-ms": "1500"}),
    "400": (400, {}),
    "401": (401, {}),
    "404": (404, {}),
    "408": (408, {}),
    "409": (409, {}),
    "422": (422, {}),
}


def completion(finish_reason: str, content: str) -> dict:
    """A chat completion as the OpenAI API sends it."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": finish_reason,
                "message": {"role": "assistant", "content": content},
            }
        ],
    }


# Path segment -> a chat completion answered with 200.
COMPLETIONS = {
    "length": completion("length", '{"answer": '),
    "content-filter": completion("content_filter", ""),
    "not-json": completion("stop", "I would rather not."),
}


class Handler(BaseHTTPRequestHandler):
    """Answers by the first path segment, so it can be an SDK's base_url."""

    def do_GET(self):
        self.answer()

    def do_POST(self):
        self.answer()

    def log_message(self, format, *args):
        pass

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)  # unread bytes would make close() send a reset instead of a FIN
        case = self.path.strip("/").split("/")[0]
        if case == "slow":
            self.server.stopping.wait(5)  # past the client's timeout; ends at teardown
            self.close_connection = True
            return
        if case == "close":
            self.close_connection = True  # hang up without a status line
            return
        if case in COMPLETIONS:
            status, headers, body = 200, {}, COMPLETIONS[case]
        else:
            status, headers = ERROR_ANSWERS[case]
            body = {"error": {"message": f"case {case}", "type": "test_error"}}
        payload = json.dumps(body).encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def server():
    """Base URL of a threaded HTTP server on loopback; its threads are joined at teardown."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = False  # so server_close() joins the request threads
    httpd.stopping = threading.Event()
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.stopping.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
        assert not thread.is_alive()


@pytest.fixture(scope="module")
def refused():
    """A URL whose port is bound but not listening: connecting is refused at once, and no one can take the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def raised(call) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return info.value


def call_httpx(url: str):
    with httpx.Client(timeout=CLIENT_TIMEOUT, trust_env=False) as client:
        client.post(f"{url}/x", json={}).raise_for_status()


def call_requests(url: str):
    with requests.Session() as session:
        session.trust_env = False
        session.post(f"{url}/x", json={}, timeout=CLIENT_TIMEOUT).raise_for_status()


def call_openai(url: str):
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=CLIENT_TIMEOUT)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])


def call_anthropic(url: str):
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=CLIENT_TIMEOUT)
    client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])


CLIENTS = {
    "httpx": call_httpx,
    "requests": call_requests,
    "openai": call_openai,
    "anthropic": call_anthropic,
}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(
    ("case", "kind", "uncertain", "retry_after"),
    [
        ("429", "retryable", False, 7.0),
        ("503", "retryable", False, None),
        ("500", "retryable", True, 1.5),
        ("408", "retryable", False, None),
        ("409", "retryable", False, None),
        ("400", "fatal", False, None),
        ("401", "fatal", False, None),
        ("404", "fatal", False, None),
        ("422", "fatal", False, None),
    ],
)
def test_http_status(server, client, case, kind, uncertain, retry_after):
    c = classify(raised(lambda: CLIENTS[client](f"{server}/{case}")))

    assert (c.kind, c.uncertain, c.status_code, c.retry_after) == (
        kind,
        uncertain,
        int(case),
        retry_after,
    )
    assert c.reason == f"HTTP {case} from the callee ({kind})"


@pytest.mark.parametrize("client", CLIENTS)
def test_read_timeout_is_retryable_but_uncertain(server, client):
    started = time.monotonic()
    exc = raised(lambda: CLIENTS[client](f"{server}/slow"))
    assert time.monotonic() - started < 3  # the client's timeout fired, not the server's answer

    c = classify(exc)

    assert (c.kind, c.uncertain, c.status_code, c.retry_after) == ("retryable", True, None, None)
    assert "may have reached the callee" in c.reason


@pytest.mark.parametrize("client", CLIENTS)
def test_connection_closed_without_an_answer_is_retryable_but_uncertain(server, client):
    c = classify(raised(lambda: CLIENTS[client](f"{server}/close")))

    assert (c.kind, c.uncertain, c.status_code) == ("retryable", True, None)


@pytest.mark.parametrize("client", CLIENTS)
def test_connection_refused_is_retryable_and_certain(refused, client):
    c = classify(raised(lambda: CLIENTS[client](refused)))

    assert (c.kind, c.uncertain, c.status_code) == ("retryable", False, None)
    assert "before the request reached the callee" in c.reason


def test_connect_timeout_is_certain():
    # 192.0.2.0/24 is reserved for documentation: nothing answers, so connecting times out
    # (or fails at once where there is no route; both are certain not to have sent anything).
    exc = raised(lambda: httpx.get("http://192.0.2.1/", timeout=0.2, trust_env=False))
    assert isinstance(exc, httpx.ConnectTimeout | httpx.ConnectError)

    c = classify(exc)

    assert (c.kind, c.uncertain) == ("retryable", False)


class Answer(pydantic.BaseModel):
    answer: str


def parse_with_openai(url: str):
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=CLIENT_TIMEOUT)
    client.chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "hi"}], response_format=Answer
    )


@pytest.mark.parametrize(
    ("case", "exc_type", "says"),
    [
        ("length", openai.LengthFinishReasonError, "length limit"),
        ("content-filter", openai.ContentFilterFinishReasonError, "content filter"),
        ("not-json", pydantic.ValidationError, "validation"),
    ],
)
def test_unusable_model_answers_are_fatal(server, case, exc_type, says):
    exc = raised(lambda: parse_with_openai(f"{server}/{case}"))
    assert isinstance(exc, exc_type)

    c = classify(exc)

    assert (c.kind, c.uncertain, c.status_code, c.retry_after) == ("fatal", False, None, None)
    assert says in c.reason


def test_http_date_retry_after_is_honoured():
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=120), usegmt=True)
    response = httpx.Response(
        503, headers={"Retry-After": later}, request=httpx.Request("GET", "http://x/")
    )

    c = classify(raised(response.raise_for_status))

    assert c.kind == "retryable"
    assert 110 < c.retry_after <= 120


@pytest.mark.parametrize("value", ["-5", "soon", "nan", ""])
def test_unusable_retry_after_is_ignored(value):
    response = httpx.Response(
        429, headers={"Retry-After": value}, request=httpx.Request("GET", "http://x/")
    )

    c = classify(raised(response.raise_for_status))

    assert (c.kind, c.retry_after) == ("retryable", None)


def test_a_huge_retry_after_is_capped():
    response = httpx.Response(
        429, headers={"Retry-After": "1e12"}, request=httpx.Request("GET", "http://x/")
    )

    assert classify(raised(response.raise_for_status)).retry_after == 24 * 3600


@pytest.mark.parametrize(
    ("exc", "kind", "uncertain", "retry_after"),
    [
        (Retryable("try later", retry_after=30), "retryable", False, 30),
        (Fatal("no"), "fatal", False, None),
        (Ambiguous("charged twice?"), "ambiguous", True, None),
        # Explicit classes win over what the rest of the rules would say.
        (type("RetryableValueError", (Retryable, ValueError), {})("x"), "retryable", False, None),
    ],
)
def test_explicit_classes_keep_their_kind(exc, kind, uncertain, retry_after):
    c = classify(exc)

    assert (c.kind, c.uncertain, c.retry_after) == (kind, uncertain, retry_after)
    assert type(exc).__name__ in c.reason


@pytest.mark.parametrize(
    ("exc", "uncertain"),
    [
        (ConnectionRefusedError(), False),
        (ConnectionResetError(), True),
        (BrokenPipeError(), True),
        (ConnectionAbortedError(), True),
        (ConnectionError(), True),
        (TimeoutError(), True),
    ],
)
def test_builtin_network_errors_are_retryable(exc, uncertain):
    c = classify(exc)

    assert (c.kind, c.uncertain) == ("retryable", uncertain)


def test_a_socket_timeout_is_retryable_but_uncertain(server):
    port = int(server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT) as sock:
        sock.sendall(b"GET /slow HTTP/1.0\r\n\r\n")
        exc = raised(lambda: sock.recv(1))
    assert isinstance(exc, socket.timeout)

    c = classify(exc)

    assert (c.kind, c.uncertain) == ("retryable", True)


@pytest.mark.parametrize(
    "exc", [ValueError("bad"), TypeError("bad"), KeyError("k"), json.JSONDecodeError("x", "", 0)]
)
def test_invalid_values_are_fatal(exc):
    assert classify(exc).kind == "fatal"


def test_pydantic_validation_error_is_fatal():
    exc = raised(lambda: Answer.model_validate({"answer": 42}))

    c = classify(exc)

    assert c.kind == "fatal"
    assert "ValidationError" in c.reason


def test_unknown_exception_is_fatal_and_named():
    class LedgerOutOfSync(Exception):
        pass

    c = classify(LedgerOutOfSync("42 != 41"))

    assert (c.kind, c.uncertain, c.status_code, c.retry_after) == ("fatal", False, None, None)
    assert "test_unknown_exception_is_fatal_and_named.<locals>.LedgerOutOfSync" in c.reason


def test_the_engine_uses_the_classifier(server):
    exc = raised(lambda: call_openai(f"{server}/429"))

    assert (classify(exc).kind, classify(exc).retry_after) == ("retryable", 7.0)
    assert (classify(KeyError("k")).kind, classify(KeyError("k")).retry_after) == ("fatal", None)


def test_a_connection_error_without_a_known_cause_is_uncertain():
    c = classify(anthropic.APIConnectionError(request=None))

    assert (c.kind, c.uncertain) == ("retryable", True)


def test_the_classifier_imports_no_client_library():
    code = "import sys, workers.classify; print(sorted({'httpx', 'httpx2', 'requests', 'openai', 'anthropic'} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    assert done.stdout.strip() == "[]"
