"""The outbound POST of one webhook delivery (DESIGN.md §8).

`send` never raises for the network: every outcome is a `Sent` the
delivery loop can record and schedule from. The connection goes to the
address `resolve` checked, not to the name (so DNS cannot change its mind
between check and connect), while TLS still verifies the certificate
against the name: httpx connects to `request_url` and is given the name
as SNI and `Host`. Redirects are never followed, since a redirect is a
second, unchecked URL; and the answer is read only up to MAX_BODY_BYTES,
because the receiver, not us, decides how much it sends.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass

import httpx

from runs.webhooks.targets import Refused, Target, Unresolvable, resolve

MAX_BODY_BYTES = 4096
MAX_ERROR_CHARS = 500

# One client shared by the delivery threads. No keep-alive: the pool keys
# connections by address, so a kept connection verified for one name
# would otherwise carry a request for another name on the same address.
# trust_env=False: no proxy from the environment, which would connect by
# name again and undo the pinning.
_client = httpx.Client(
    follow_redirects=False,
    trust_env=False,
    limits=httpx.Limits(max_connections=100, max_keepalive_connections=0),
)


@dataclass(frozen=True)
class Sent:
    """What came of one attempt."""

    status: int | None  # the HTTP status, None when there was no response
    body: str  # the first MAX_BODY_BYTES of the answer, NULs removed
    error: str  # why it was not delivered; "" when it was
    delivered: bool  # the receiver answered 2xx
    permanent: bool  # retrying cannot help (a refused target, 410 Gone)


def send(url: str, *, body: bytes, headers: dict[str, str], timeout: float = 10.0) -> Sent:
    """POST body to url with headers, to the address checked once by `resolve`."""
    try:
        target = resolve(url)
    except Refused as exc:
        return _failed(str(exc), permanent=True)
    except Unresolvable as exc:
        return _failed(str(exc))
    try:
        return _post(target, body=body, headers=headers, timeout=timeout)
    except httpx.TimeoutException as exc:
        return _failed(f"timed out after {timeout:g} s ({_PHASES.get(type(exc), 'waiting')})")
    except httpx.ConnectError as exc:
        return _failed(_connect_error(exc))
    except httpx.RemoteProtocolError as exc:
        return _failed(f"the receiver broke the connection ({exc})")
    except httpx.HTTPError as exc:
        return _failed(f"the request failed ({exc})")


_PHASES = {
    httpx.ConnectTimeout: "connecting",
    httpx.WriteTimeout: "sending",
    httpx.ReadTimeout: "waiting for the answer",
    httpx.PoolTimeout: "waiting for a free connection",
}


def _post(target: Target, *, body: bytes, headers: dict[str, str], timeout: float) -> Sent:
    request_headers = httpx.Headers(headers)
    request_headers["Host"] = target.host_header
    # Uncompressed, so that the bytes read are the bytes kept (no gzip bomb).
    request_headers["Accept-Encoding"] = "identity"
    extensions = {"sni_hostname": target.tls_name} if target.scheme == "https" else {}
    deadline = time.monotonic() + timeout
    with _client.stream(
        "POST",
        target.request_url,
        content=body,
        headers=request_headers,
        extensions=extensions,
        timeout=httpx.Timeout(timeout),
    ) as response:
        received = bytearray()
        try:
            for chunk in response.iter_raw():
                received += chunk
                # Each read has its own timeout; the deadline stops a receiver
                # that drips its answer a byte at a time.
                if len(received) >= MAX_BODY_BYTES or time.monotonic() > deadline:
                    break
        except httpx.HTTPError:
            pass  # the status has arrived and decides; the body is only a courtesy
    text = bytes(received[:MAX_BODY_BYTES]).decode("utf-8", errors="replace").replace("\x00", "")
    status = response.status_code
    if 200 <= status < 300:
        return Sent(status=status, body=text, error="", delivered=True, permanent=False)
    if 300 <= status < 400:
        location = _printable(response.headers.get("Location", ""))[:200]
        where = f" (redirect to {location})" if location else ""
        error = f"the receiver answered {status}{where}; redirects are not followed"
    elif status == 410:
        error = "the receiver answered 410 Gone; it wants no more deliveries"
    else:
        error = f"the receiver answered {status}"
    return Sent(status=status, body=text, error=error, delivered=False, permanent=status == 410)


def _connect_error(exc: httpx.ConnectError) -> str:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"the certificate was not accepted ({cause.verify_message})"
        if isinstance(cause, ssl.SSLError):
            return f"the TLS handshake failed ({cause.reason or cause})"
        cause = cause.__cause__ or cause.__context__
    return f"could not connect ({exc})"


def _printable(text: str) -> str:
    return "".join(ch for ch in text if ch.isprintable())


def _failed(error: str, *, permanent: bool = False) -> Sent:
    return Sent(
        status=None,
        body="",
        error=_printable(error)[:MAX_ERROR_CHARS],
        delivered=False,
        permanent=permanent,
    )
