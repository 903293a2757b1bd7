"""Where a webhook may be sent: the SSRF guard (docs/how-to/webhooks.md).

A callback URL is chosen by whoever submits a run, so without a guard the
worker would POST to whatever it can reach: the cloud metadata service,
the database, an admin port on loopback. The rule is that a delivery goes
only to globally routable addresses, and that the name is resolved exactly
once: the sender connects to the address checked here (`Target`), never
to the name again, so a DNS answer that changes between check and connect
(DNS rebinding) cannot steer it. `RUNS_WEBHOOKS_ALLOW_PRIVATE` lifts the
address rule and allows plain http, for development and tests.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings

MAX_URL_LENGTH = 2000
DEFAULT_PORTS = {"https": 443, "http": 80}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Label characters after IDNA encoding; `_` is not legal in host names but
# appears in real ones, and resolution is the judge of what exists.
_HOST_NAME = re.compile(r"(?:[a-z0-9_-]{1,63}\.)*[a-z0-9_-]{1,63}\.?")

_n = ipaddress.ip_network
# Most specific wording first; anything else not `is_global` is refused too.
_RANGES: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str]] = [
    (_n("0.0.0.0/8"), "an unspecified address"),
    (_n("127.0.0.0/8"), "a loopback address"),
    (_n("169.254.0.0/16"), "a link-local address (cloud metadata lives there)"),
    (_n("10.0.0.0/8"), "a private address"),
    (_n("172.16.0.0/12"), "a private address"),
    (_n("192.168.0.0/16"), "a private address"),
    (_n("100.64.0.0/10"), "in the shared address space 100.64.0.0/10 (carrier-grade NAT)"),
    (_n("192.0.0.0/24"), "a reserved address (IETF protocol assignments)"),
    (_n("192.0.2.0/24"), "a documentation address"),
    (_n("198.51.100.0/24"), "a documentation address"),
    (_n("203.0.113.0/24"), "a documentation address"),
    (_n("198.18.0.0/15"), "a benchmarking address"),
    (_n("224.0.0.0/4"), "a multicast address"),
    (_n("240.0.0.0/4"), "a reserved address"),
    (_n("::/128"), "an unspecified address"),
    (_n("::1/128"), "a loopback address"),
    (_n("::/96"), "an IPv4-compatible address (deprecated)"),
    (_n("::ffff:0:0:0/96"), "an IPv4-translated address"),
    (_n("fe80::/10"), "a link-local address"),
    (_n("fec0::/10"), "a site-local address"),
    (_n("fc00::/7"), "a private (unique local) address"),
    (_n("ff00::/8"), "a multicast address"),
    (_n("2001:db8::/32"), "a documentation address"),
    (_n("3fff::/20"), "a documentation address"),
    (_n("64:ff9b:1::/48"), "a local-use NAT64 address"),
    (_n("2001::/32"), "a Teredo tunnel address"),
    (_n("100::/64"), "a discard-only address"),
]
# IPv6 forms that carry an IPv4 address the packet ends up at.
_NAT64 = _n("64:ff9b::/96")


class Refused(Exception):
    """A URL or address we will never send to; str() is a readable sentence."""


class Unresolvable(Exception):
    """The host name could not be resolved now; the caller retries later."""


def allow_private() -> bool:
    """Whether http and non-global addresses are allowed (development and tests)."""
    return bool(getattr(settings, "RUNS_WEBHOOKS_ALLOW_PRIVATE", False))


def forbidden_reason(ip: IPAddress) -> str | None:
    """None for a globally routable unicast address, else why we refuse it."""
    phrase = _forbidden_phrase(ip)
    return None if phrase is None else f"{ip} is {phrase}"


def _forbidden_phrase(ip: IPAddress) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address):
        for form, inner in (
            ("an IPv4-mapped", ip.ipv4_mapped),
            ("a 6to4", ip.sixtofour),
            ("a NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None),
        ):
            if inner is not None:
                phrase = _forbidden_phrase(inner)
                return None if phrase is None else f"{form} form of {inner}, {phrase}"
    for network, phrase in _RANGES:
        if ip.version == network.version and ip in network:
            return phrase
    if not ip.is_global:
        return "a reserved address" if ip.is_reserved else "not a globally routable address"
    return None


@dataclass(frozen=True)
class Target:
    """A checked URL pinned to one address: connect there, present the name."""

    url: str  # as given
    scheme: str
    host: str  # as in the URL, lowercased and IDNA-encoded, without brackets
    port: int
    address: str  # the IP the connection goes to
    request_url: str  # url with the host replaced by address
    host_header: str  # host[:port], the port only when not the scheme's default

    @property
    def tls_name(self) -> str:
        """The name the certificate must carry: the host, or the canonical IP of a literal."""
        return self.address if _ip_literal(self.host) is not None else self.host


@dataclass(frozen=True)
class _Parts:
    scheme: str
    host: str
    port: int
    path: str
    query: str


def check_url(url: str, *, allow_private: bool | None = None) -> None:
    """Refuse what can be known without DNS (at submit time and for endpoints)."""
    private = _allowed(allow_private)
    parts = _parse(url, private=private)
    literal = _ip_literal(parts.host)
    if not private:
        _refuse_literal(parts.host)
        bare = parts.host.rstrip(".")
        if bare == "localhost" or bare.endswith(".localhost"):
            raise Refused(f"{parts.host} is a loopback name")
    # With private addresses allowed, a name's port is judged once it is resolved.
    if not private or (literal is not None and _forbidden_phrase(literal) is None):
        _check_port(parts)


def resolve(url: str, *, allow_private: bool | None = None) -> Target:
    """Resolve the host once and pin the first address; refuse if any address is forbidden."""
    private = _allowed(allow_private)
    parts = _parse(url, private=private)
    literal = _ip_literal(parts.host)
    if literal is not None:
        if not private:
            _refuse_literal(parts.host)
        addresses = [literal]
    else:
        try:
            infos = socket.getaddrinfo(parts.host, parts.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise Unresolvable(f"could not resolve {parts.host}: {exc.strerror}") from exc
        addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
        if not addresses:
            raise Unresolvable(f"could not resolve {parts.host}: no addresses")
        # Any bad answer refuses: a name that also points inside is not pinned around.
        for ip in addresses:
            phrase = None if private else _forbidden_phrase(ip)
            if phrase is not None:
                raise Refused(f"{parts.host} resolves to {ip}, {phrase}")
    if _forbidden_phrase(addresses[0]) is None:
        _check_port(parts)  # a public address: only the ports operators allow
    address = str(addresses[0])
    suffix = f":{parts.port}" if parts.port != DEFAULT_PORTS[parts.scheme] else ""
    in_url = f"[{address}]" if ":" in address else address
    in_header = f"[{parts.host}]" if ":" in parts.host else parts.host
    return Target(
        url=url,
        scheme=parts.scheme,
        host=parts.host,
        port=parts.port,
        address=address,
        request_url=urlunsplit((parts.scheme, in_url + suffix, parts.path, parts.query, "")),
        host_header=in_header + suffix,
    )


def allowed_ports() -> list[int]:
    return list(getattr(settings, "RUNS_WEBHOOK_PORTS", [443]))


def _check_port(parts: _Parts) -> None:
    """A public host only on the allowed ports: a webhook must not probe a host's other services."""
    ports = allowed_ports()
    if parts.port not in ports:
        listed = ", ".join(str(p) for p in ports) or "none"
        raise Refused(f"port {parts.port} is not allowed for webhooks (allowed: {listed})")


def _allowed(flag: bool | None) -> bool:
    return allow_private() if flag is None else flag


def _parse(url: str, *, private: bool) -> _Parts:
    """The scheme and shape checks: everything but the address rule."""
    if len(url) > MAX_URL_LENGTH:
        raise Refused(f"the URL is longer than {MAX_URL_LENGTH} characters")
    # urlsplit silently strips some of these, so a URL that looks one way
    # to a person could parse another way here.
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise Refused("the URL contains whitespace or control characters")
    try:
        split = urlsplit(url)
    except ValueError as exc:
        raise Refused(f"the URL is not valid ({exc})") from exc
    allowed = ("http", "https") if private else ("https",)
    if split.scheme not in allowed:
        raise Refused(f"only {' and '.join(allowed)} URLs are delivered (got {split.scheme!r})")
    hostname, port = _authority(split.netloc)
    if ":" in hostname:
        host = hostname
    else:
        try:
            host = hostname.encode("idna").decode("ascii").lower()
        except UnicodeError as exc:
            raise Refused(f"{hostname!r} is not a valid host name") from exc
        if len(host) > 253 or not _HOST_NAME.fullmatch(host):
            raise Refused(f"{hostname!r} is not a valid host name")
    return _Parts(
        scheme=split.scheme,
        host=host,
        port=port or DEFAULT_PORTS[split.scheme],
        path=split.path or "/",
        query=split.query,
    )


_PORT = re.compile(r"[0-9]{1,5}")


def _authority(netloc: str) -> tuple[str, int | None]:
    """The host and port of ``host[:port]`` or ``[IPv6][:port]``, strictly (RFC 3986 §3.2).

    By hand because urlsplit and httpx both let through what no receiver
    could be: ports like ``+80`` or ``-1``, text after ``]``, IPvFuture
    literals and zone ids (urlsplit then fails later with a ValueError).
    """
    if "@" in netloc:
        raise Refused("credentials in the URL are not accepted")
    port_text: str | None  # None: no port
    if netloc.startswith("["):
        literal, closed, rest = netloc[1:].partition("]")
        if not closed:
            raise Refused("the URL's IPv6 address has no closing ']'")
        if "%" in literal:
            raise Refused("IPv6 zone ids (%) are not accepted")
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            raise Refused(f"[{literal[:60]}] is not a valid IPv6 address") from None
        host, port_text = literal.lower(), rest
        if port_text and not port_text.startswith(":"):
            raise Refused(f"unexpected {port_text[:40]!r} after the IPv6 address")
        port_text = port_text[1:] if port_text else None
    else:
        if "[" in netloc or "]" in netloc:
            raise Refused("'[' and ']' only enclose an IPv6 address")
        host, colon, port_text = netloc.partition(":")
        if not colon:
            port_text = None
        elif ":" in port_text:
            raise Refused("more than one ':' after the host (an IPv6 address goes in brackets)")
    if not host:
        raise Refused("the URL has no host")
    if port_text is None:
        return host, None
    if not _PORT.fullmatch(port_text):
        raise Refused(f"the port {port_text[:20]!r} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise Refused(f"port {port} is out of range (1-65535)")
    return host, port


def _ip_literal(host: str) -> IPAddress | None:
    """The address a literal host means, with the spellings resolvers accept (`0x7f.1`)."""
    if ":" in host:
        return ipaddress.IPv6Address(host)
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host.rstrip(".")))
    except OSError:
        return None


def _refuse_literal(host: str) -> None:
    ip = _ip_literal(host)
    phrase = None if ip is None else _forbidden_phrase(ip)
    if phrase is not None:
        verb = "is" if str(ip) == host else f"means {ip},"
        raise Refused(f"{host} {verb} {phrase}")
