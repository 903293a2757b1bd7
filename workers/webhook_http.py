"""The outbound POST of one webhook delivery (docs/how-to/webhooks.md).

`send` never raises for the network: every outcome is a `Sent` the
delivery loop can record and schedule from. The connection goes to the
address `resolve` checked, not to the name (so DNS cannot change its mind
between check and connect), while TLS still verifies the certificate
against the name: httpx connects to `request_url` and is given the name
as SNI and `Host`. Redirects are never followed, since a redirect is a
second, unchecked URL; and the answer is read only up to MAX_BODY_BYTES,
because the receiver, not us, decides how much it sends.

The timeout bounds the whole attempt (resolving, connecting, sending,
waiting for the status line and headers), not each read: a receiver that
accepts and drips a byte now and then would otherwise hold a send slot for
as long as it likes. httpx's own timeouts are per operation, so the attempt
runs as a coroutine under one `asyncio.timeout`, which cancels it wherever
it is. Connecting has its own, shorter timeout: a host that does not accept
is given up on quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from django.conf import settings

from runs.models import DeliveryFailure
from runs.webhooks.targets import Refused, Target, Unresolvable, resolve

MAX_BODY_BYTES = 4096
MAX_ERROR_CHARS = 500

# Verification settings loaded once (the CA bundle is slow to parse), shared
# by every attempt's client; an SSLContext is safe to use from many threads.
_SSL_CONTEXT = httpx.create_ssl_context()

# getaddrinfo cannot be interrupted: a resolution still going at the deadline
# is left to finish here, on threads of its own (asyncio.run would wait for
# its default executor's threads on the way out).
_RESOLVERS = ThreadPoolExecutor(16, thread_name_prefix="webhook-dns")

# httpcore's trace events, as the phase a timeout names.
_PHASES = {
    "connection.connect_tcp.started": "connecting",
    "connection.start_tls.started": "in the TLS handshake",
    "http11.send_request_headers.started": "sending",
    "http11.receive_response_headers.started": "waiting for the answer",
}


@dataclass(frozen=True)
class Sent:
    """What came of one attempt."""

    status: int | None  # the HTTP status, None when there was no response
    body: str  # the first MAX_BODY_BYTES of the answer, NULs removed
    error: (
        str  # why it was not delivered; "" when it was (operators read it: it may name addresses)
    )
    delivered: bool  # the receiver answered 2xx
    permanent: bool  # retrying cannot help (a refused target, 410 Gone)
    failure: str = ""  # a DeliveryFailure: what the tenant is told

    @property
    def unanswered(self) -> bool:
        """No answer came (a timeout, no connection): what pauses a receiver that keeps doing it."""
        return self.failure in (DeliveryFailure.TIMEOUT, DeliveryFailure.CONNECT)


def send(
    url: str,
    *,
    body: bytes,
    headers: dict[str, str],
    timeout: float = 10.0,
    connect_timeout: float | None = None,
) -> Sent:
    """POST body to url with headers, to the address checked once by `resolve`, all within ``timeout``."""
    if connect_timeout is None:
        connect_timeout = settings.RUNS_WEBHOOK_CONNECT_TIMEOUT_SECONDS
    connect_timeout = min(connect_timeout, timeout)
    try:
        return asyncio.run(
            _attempt(
                url, body=body, headers=headers, timeout=timeout, connect_timeout=connect_timeout
            )
        )
    except Refused as exc:
        return _failed(str(exc), DeliveryFailure.REFUSED, permanent=True)
    except Unresolvable as exc:
        return _failed(str(exc), DeliveryFailure.CONNECT)
    except httpx.ConnectTimeout:
        return _failed(f"could not connect within {connect_timeout:g} s", DeliveryFailure.CONNECT)
    except httpx.TimeoutException as exc:
        return _failed(
            f"timed out after {timeout:g} s ({type(exc).__name__})", DeliveryFailure.TIMEOUT
        )
    except httpx.ConnectError as exc:
        return _failed(_connect_error(exc), DeliveryFailure.CONNECT)
    except httpx.RemoteProtocolError as exc:
        return _failed(f"the receiver broke the connection ({exc})", DeliveryFailure.CONNECT)
    except httpx.HTTPError as exc:
        return _failed(f"the request failed ({exc})", DeliveryFailure.CONNECT)


async def _attempt(
    url: str, *, body: bytes, headers: dict[str, str], timeout: float, connect_timeout: float
) -> Sent:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    phase = "resolving the name"

    async def trace(event: str, info: dict) -> None:
        nonlocal phase
        phase = _PHASES.get(event, phase)

    # No keep-alive, a client per attempt: the pool keys connections by
    # address, so a kept connection verified for one name would otherwise
    # carry a request for another name on the same address. trust_env=False:
    # no proxy from the environment, which would connect by name again and
    # undo the pinning.
    async with httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        verify=_SSL_CONTEXT,
        limits=httpx.Limits(max_keepalive_connections=0),
    ) as client:
        try:
            async with asyncio.timeout_at(deadline):
                target = await loop.run_in_executor(_RESOLVERS, resolve, url)
                request = _request(
                    client,
                    target,
                    body=body,
                    headers=headers,
                    timeout=httpx.Timeout(timeout, connect=connect_timeout),
                    trace=trace,
                )
                response = await client.send(request, stream=True)
        except TimeoutError:
            return _failed(f"timed out after {timeout:g} s ({phase})", DeliveryFailure.TIMEOUT)
        try:
            received = await _read_capped(response, deadline)
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1):
                    await response.aclose()
    return _answered(response, received)


def _request(
    client: httpx.AsyncClient,
    target: Target,
    *,
    body: bytes,
    headers: dict[str, str],
    timeout: httpx.Timeout,
    trace,
) -> httpx.Request:
    request_headers = httpx.Headers(headers)
    request_headers["Host"] = target.host_header
    # Uncompressed, so that the bytes read are the bytes kept (no gzip bomb).
    request_headers["Accept-Encoding"] = "identity"
    extensions = {"trace": trace}
    if target.scheme == "https":
        extensions["sni_hostname"] = target.tls_name
    return client.build_request(
        "POST",
        target.request_url,
        content=body,
        headers=request_headers,
        extensions=extensions,
        timeout=timeout,
    )


async def _read_capped(response: httpx.Response, deadline: float) -> bytes:
    """Up to MAX_BODY_BYTES of the answer, read until the deadline at most."""
    received = bytearray()
    try:
        async with asyncio.timeout_at(deadline):
            async for chunk in response.aiter_raw():
                received += chunk
                if len(received) >= MAX_BODY_BYTES:
                    break
    except (TimeoutError, httpx.HTTPError):
        pass  # the status has arrived and decides; the body is only a courtesy
    return bytes(received[:MAX_BODY_BYTES])


def _answered(response: httpx.Response, received: bytes) -> Sent:
    text = received.decode("utf-8", errors="replace").replace("\x00", "")
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
    return Sent(
        status=status,
        body=text,
        error=error,
        delivered=False,
        permanent=status == 410,
        failure=DeliveryFailure.HTTP,
    )


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


def _failed(error: str, failure: str, *, permanent: bool = False) -> Sent:
    return Sent(
        status=None,
        body="",
        error=_printable(error)[:MAX_ERROR_CHARS],
        delivered=False,
        permanent=permanent,
        failure=failure,
    )
