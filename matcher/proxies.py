"""The service behind proxies: what a trusted proxy says about the client is believed, and
nothing a client says about itself.

A proxy in front of the matcher (nginx terminating TLS, HAProxy balancing) connects to it
itself, so the connection's peer is the proxy and the request is plain HTTP. The proxy tells
the service in headers where the request came from (``X-Forwarded-For``), and which scheme,
host and port the client used (``X-Forwarded-Proto``, ``-Host``, ``-Port``). Anybody can send
those headers, so they are read only from a peer of ``[matcher] trusted_proxies``; from
anyone else they are ignored (none is trusted by default).

The client's address is the right-most address of ``X-Forwarded-For`` (the proxies append the
address of their own peer) that is not itself a trusted proxy: what a client wrote at the
left of the list is never taken. For the scheme, host and port the right-most value counts:
the proxy that terminates TLS sets those headers, replacing what the client sent, and the
proxies behind it pass them on. A value that is not a scheme, host or port is ignored.

Once read, the WSGI environment says what the client saw (``wsgi.url_scheme``, ``HTTP_HOST``,
``SERVER_PORT``, ``REMOTE_ADDR``), so Flask's ``request.is_secure``, ``url_for(...,
_external=True)`` and ``request.remote_addr`` need nothing else.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
StartResponse = Callable[..., Any]
WSGIApplication = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

#: A host as a client may name it: a DNS name, an IPv4 address or a bracketed IPv6 one, with
#: an optional port.
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
                   r"(?::[0-9]{1,5})?")


def networks(items: Iterable[str]) -> tuple[Network, ...]:
    """The addresses and networks of a setting (checked when the settings were loaded)."""
    return tuple(ipaddress.ip_network(item, strict=False) for item in items)


def address_in(text: str | None, among: tuple[Network, ...]) -> bool:
    """Whether ``text`` is an IP address inside one of ``among``."""
    if not text or not among:
        return False
    try:
        address = ipaddress.ip_address(text.strip().removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address.version == net.version and address in net for net in among)


class TrustedProxies:
    """WSGI middleware that applies the forwarded headers of trusted proxies (see module)."""

    def __init__(self, app: WSGIApplication, trusted: Iterable[str]) -> None:
        self.app = app
        self.trusted = networks(trusted)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse
                 ) -> Iterable[bytes]:
        if address_in(environ.get("REMOTE_ADDR"), self.trusted):
            self.apply(environ)
        return self.app(environ, start_response)

    def apply(self, environ: dict[str, Any]) -> None:
        """Rewrite ``environ`` as the trusted proxies describe the request."""
        hops = _values(environ.get("HTTP_X_FORWARDED_FOR"))
        for hop in reversed(hops):
            client = hop.removeprefix("[").removesuffix("]")
            if not _is_address(client):
                break  # garbage: nothing further left can be believed either
            environ["REMOTE_ADDR"] = client
            if not address_in(client, self.trusted):
                break
        proto = _last(environ.get("HTTP_X_FORWARDED_PROTO"))
        if proto is not None and proto.lower() in ("http", "https"):
            environ["wsgi.url_scheme"] = proto.lower()
        default = {"https": "443", "http": "80"}.get(environ.get("wsgi.url_scheme", ""), "")
        host = _last(environ.get("HTTP_X_FORWARDED_HOST"))
        if host is not None and _HOST.fullmatch(host):
            name, given = _split(host)
            if given and not 0 < int(given) < 65536:
                name, given = "", ""  # not a port: the header is ignored
            if name:
                environ["SERVER_NAME"], environ["SERVER_PORT"] = name, given or default
                environ["HTTP_HOST"] = name if given in ("", default) else f"{name}:{given}"
        port = _last(environ.get("HTTP_X_FORWARDED_PORT"))
        if port is not None and port.isdigit() and 0 < int(port) < 65536:
            name = _split(environ.get("HTTP_HOST") or environ.get("SERVER_NAME", ""))[0]
            environ["SERVER_PORT"] = port
            environ["HTTP_HOST"] = name if port == default else f"{name}:{port}"


def _split(host: str) -> tuple[str, str]:
    """A host[:port] as its name and its port (empty when not given)."""
    if host.endswith("]") or ":" not in host:
        return host, ""
    name, _, port = host.rpartition(":")
    return name, port


def _values(header: str | None) -> list[str]:
    return [part.strip() for part in (header or "").split(",") if part.strip()]


def _last(header: str | None) -> str | None:
    values = _values(header)
    return values[-1] if values else None


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
