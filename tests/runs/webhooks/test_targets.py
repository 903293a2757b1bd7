"""Where webhooks may go (the SSRF guard) and how the sender behaves, over real sockets."""

from __future__ import annotations

import ipaddress
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runs.webhooks.targets import Refused, check_url, resolve
from workers.webhook_http import MAX_BODY_BYTES, send

# Where "localhost" leads first on this machine (127.0.0.1, or ::1 on some
# systems); the receivers listen there so that name-based URLs reach them.
LOOPBACK = socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)[0][4][0]
FAMILY = socket.AF_INET6 if ":" in LOOPBACK else socket.AF_INET
LOOPBACK_IN_URL = f"[{LOOPBACK}]" if ":" in LOOPBACK else LOOPBACK


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://example.com/hook", "only https URLs are delivered (got 'ftp')"),
        ("http://example.com/hook", "only https URLs are delivered (got 'http')"),
        ("https:///hook", "no host"),
        ("https://127.0.0.1/", "127.0.0.1 is a loopback address"),
        ("https://[::1]/", "::1 is a loopback address"),
        ("https://169.254.169.254/latest/meta-data", "link-local address (cloud metadata"),
        ("https://10.0.0.1/", "10.0.0.1 is a private address"),
        ("https://[::ffff:127.0.0.1]/", "IPv4-mapped form of 127.0.0.1, a loopback address"),
        ("https://2130706433/", "2130706433 means 127.0.0.1, a loopback address"),
        ("https://0x7f.1/", "0x7f.1 means 127.0.0.1, a loopback address"),
        ("https://[64:ff9b::a00:1]/", "NAT64 form of 10.0.0.1, a private address"),
        ("https://100.100.100.200/", "shared address space"),
        ("https://localhost/", "localhost is a loopback name"),
        ("https://foo.localhost/", "foo.localhost is a loopback name"),
        ("https://example.com:0/", "port 0 is out of range"),
        ("https://exa mple.com/", "whitespace"),
        ("https://user:secret@example.com/", "credentials"),
        ("https://example.com/" + "a" * 2000, "longer than 2000"),
    ],
)
def test_check_url_refuses(url, reason):
    with pytest.raises(Refused) as refused:
        check_url(url, allow_private=False)
    assert reason in str(refused.value)


@pytest.mark.parametrize("url", ["https://example.com/hook", "https://93.184.216.34/"])
def test_check_url_accepts_global_https(url):
    check_url(url, allow_private=False)


def test_check_url_with_private_allowed_accepts_http_loopback():
    check_url("http://127.0.0.1:8000/", allow_private=True)
    with pytest.raises(Refused, match="got 'ftp'"):
        check_url("ftp://127.0.0.1/", allow_private=True)


def test_check_url_reads_the_setting(settings):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = True
    check_url("http://127.0.0.1:8000/")
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = False
    with pytest.raises(Refused):
        check_url("http://127.0.0.1:8000/")


def test_resolve_refuses_a_name_that_resolves_to_loopback():
    with pytest.raises(Refused) as refused:
        resolve("https://localhost:8443/x", allow_private=False)
    assert str(refused.value) == f"localhost resolves to {LOOPBACK}, a loopback address"


def test_resolve_pins_the_address_and_keeps_the_name():
    target = resolve("https://localhost:8443/x?a=1#frag", allow_private=True)
    assert ipaddress.ip_address(target.address).is_loopback
    assert target.address == LOOPBACK
    assert target.request_url == f"https://{LOOPBACK_IN_URL}:8443/x?a=1"
    assert (target.host, target.port, target.host_header) == ("localhost", 8443, "localhost:8443")


class Receiver:
    """A real HTTP server on loopback that records what it was sent."""

    def __init__(self, respond):
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.peers: list[tuple] = []  # the client end of each request's connection
        requests, peers = self.requests, self.peers

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive allowed: the sender must not use it

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                requests.append((self.path, dict(self.headers), body))
                peers.append(self.client_address)
                respond(self)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            address_family = FAMILY

            def handle_error(self, request, client_address):
                pass  # the sender hangs up early on purpose

        self.server = Server((LOOPBACK, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def url(self, path="/hook"):
        return f"http://localhost:{self.port}{path}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def start_receiver(settings):
    """Starts receivers that answer as ``respond`` does (private addresses allowed); all stop at teardown."""
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = True
    started: list[Receiver] = []

    def start(respond) -> Receiver:
        started.append(Receiver(respond))
        return started[-1]

    yield start
    for each in started:
        each.close()


@pytest.fixture
def listener():
    """A socket that accepts connections (in the kernel) and never answers."""
    with socket.create_server((LOOPBACK, 0), family=FAMILY) as sock:
        yield sock


def answer(status, body=b"", headers=()):
    def respond(handler):
        handler.send_response(status)
        for name, value in headers:
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return respond


def test_send_delivers_body_and_headers_with_the_original_host(start_receiver):
    server = start_receiver(answer(200, b"thanks\x00!"))
    sent = send(
        server.url("/hook?x=1"),
        body=b'{"type": "run.done"}',
        headers={"webhook-id": "msg_1", "Content-Type": "application/json"},
    )
    assert (sent.status, sent.delivered, sent.error, sent.body) == (200, True, "", "thanks!")
    [(path, headers, body)] = server.requests
    assert (path, body) == ("/hook?x=1", b'{"type": "run.done"}')
    assert headers["webhook-id"] == "msg_1"
    assert headers["Content-Type"] == "application/json"
    assert headers["Host"] == f"localhost:{server.port}"


@pytest.mark.parametrize(("status", "permanent"), [(500, False), (410, True)])
def test_send_reports_an_error_status(start_receiver, status, permanent):
    server = start_receiver(answer(status, b"boom"))
    sent = send(server.url(), body=b"{}", headers={})
    assert (sent.status, sent.delivered, sent.permanent) == (status, False, permanent)
    assert sent.error.startswith(f"the receiver answered {status}")
    assert sent.body == "boom"


def test_send_opens_a_new_connection_for_every_delivery(start_receiver):
    """A kept connection verified for one name must never carry another name's request."""
    server = start_receiver(answer(200))
    assert send(server.url(), body=b"{}", headers={}).delivered
    assert send(server.url(), body=b"{}", headers={}).delivered
    assert len(set(server.peers)) == 2


def test_send_does_not_follow_redirects(start_receiver):
    elsewhere = start_receiver(answer(200))
    location = f"http://{LOOPBACK_IN_URL}:{elsewhere.port}/x"
    server = start_receiver(answer(302, headers=[("Location", location)]))
    sent = send(server.url(), body=b"{}", headers={})
    assert (sent.status, sent.delivered, sent.permanent) == (302, False, False)
    assert sent.error == (
        f"the receiver answered 302 (redirect to {location}); redirects are not followed"
    )
    assert len(server.requests) == 1
    assert elsewhere.requests == []


def test_send_reads_at_most_max_body_bytes(start_receiver):
    def huge(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(10 * 1024 * 1024))
        handler.end_headers()
        try:
            for _ in range(160):
                handler.wfile.write(b"a" * 65536)
        except OSError:
            pass  # the sender stopped reading, as it should

    sent = send(start_receiver(huge).url(), body=b"{}", headers={})
    assert sent.delivered
    assert sent.body == "a" * MAX_BODY_BYTES


@pytest.mark.parametrize("host", ["localhost", LOOPBACK_IN_URL])
def test_send_refuses_loopback_without_connecting(settings, listener, host):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = False
    port = listener.getsockname()[1]
    sent = send(f"https://{host}:{port}/hook", body=b"{}", headers={}, timeout=1)
    assert (sent.status, sent.delivered, sent.permanent) == (None, False, True)
    assert "a loopback address" in sent.error
    listener.settimeout(0.2)
    with pytest.raises(TimeoutError):
        listener.accept()  # nothing ever knocked


def test_send_times_out_on_a_receiver_that_never_answers(settings, listener):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = True
    port = listener.getsockname()[1]
    sent = send(f"http://localhost:{port}/hook", body=b"{}", headers={}, timeout=0.5)
    assert (sent.status, sent.delivered, sent.permanent) == (None, False, False)
    assert sent.error.startswith("timed out after 0.5 s")


def test_send_reports_connection_refused(settings, listener):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = True
    port = listener.getsockname()[1]
    listener.close()
    sent = send(f"http://localhost:{port}/hook", body=b"{}", headers={})
    assert (sent.error, sent.permanent) == ("connection refused", False)


def test_https_connects_to_the_pinned_address_and_names_the_host_in_sni(settings, listener):
    """The TCP connection reaches the loopback address, the ClientHello carries the name.

    Verifying the certificate against that name needs a certificate the
    sender trusts, which this test cannot make without network or extra
    packages; the handshake here fails on purpose.
    """
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = True
    port = listener.getsockname()[1]
    hello = bytearray()

    def read_client_hello():
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(2)
            while b"localhost" not in hello and (chunk := conn.recv(4096)):
                hello.extend(chunk)

    reader = threading.Thread(target=read_client_hello)
    reader.start()
    sent = send(f"https://localhost:{port}/hook", body=b"{}", headers={}, timeout=2)
    reader.join()
    assert hello[:1] == b"\x16"  # a TLS handshake record
    assert b"localhost" in hello
    assert (sent.status, sent.delivered, sent.permanent) == (None, False, False)
    assert sent.error
