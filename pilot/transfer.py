"""One HTTP request to the service, as the pilot and the user's client make it: within a
deadline for the whole exchange, reading at most so many bytes of answer, and following a
redirect only when it stays at the service's origin.

``requests``' timeout bounds each wait for a byte, not the whole answer: a server that trickles
its answer a byte at a time would hold the caller for ever. Here a timer shuts the
connection's socket down when the deadline passes, which ends a wait at once, in the headers
as in the body. Standard library and ``requests`` only (the pilot's dependencies).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
from requests.adapters import HTTPAdapter

from pilot import tls

#: Most bytes of one answer read by default (sandbox downloads give their own limit).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: Most redirects followed (each within the service's origin).
MAX_REDIRECTS = 5
_CHUNK = 64 * 1024


class TransferError(requests.RequestException):
    """The exchange was given up; the message says why."""


class DeadlineError(TransferError, requests.Timeout):
    """No complete answer within the deadline."""


class AnswerTooLargeError(TransferError):
    """The answer is larger than the caller reads."""


class RedirectRefusedError(TransferError):
    """The server redirected to another origin than the service's."""


class CertificateError(requests.exceptions.SSLError):
    """The server's TLS certificate could not be verified against the CAs trusted; the
    message names the server, the reason and the fix (pilot.tls)."""


class InterruptedTransferError(TransferError):
    """The exchange was given up because the process is stopping (see :func:`interrupt`)."""


class _Interrupted(BaseException):
    """Raised by :func:`interrupt` inside an exchange; no library code catches it."""


# -- the deadline: a timer that shuts the socket in use down ---------------------------------

_current = threading.local()


class _Watch:
    def __init__(self) -> None:
        # Re-entrant: a signal handler may end the wait while this thread holds it.
        self.lock = threading.RLock()
        self.sock: socket.socket | None = None
        self.expired = False

    def attach(self, sock: socket.socket | None) -> None:
        with self.lock:
            self.sock = sock
            if self.expired:
                _shut(sock)

    def expire(self) -> None:
        with self.lock:
            self.expired = True
            _shut(self.sock)


def _shut(sock: socket.socket | None) -> None:
    if sock is not None:
        with contextlib.suppress(OSError):
            # The plain socket's shutdown, also for TLS: it wakes a thread waiting to read.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _watch_this(conn: Any) -> None:
    watch: _Watch | None = getattr(_current, "watch", None)
    if watch is not None:
        watch.attach(conn.sock)


def _watched_pool(pool: type[Any]) -> type[Any]:
    """A subclass of one of urllib3's pool classes whose connections show their socket to the
    request's watch when they wait for an answer (made from the class ``requests`` uses, so
    that the pilot needs no other import)."""
    base = pool.ConnectionCls

    def getresponse(self: Any, *args: Any, **kwargs: Any) -> Any:
        _watch_this(self)
        return base.getresponse(self, *args, **kwargs)

    connection = type(f"Watched{base.__name__}", (base,), {"getresponse": getresponse})
    return type(f"Watched{pool.__name__}", (pool,), {"ConnectionCls": connection})


_POOLS: dict[str, type[Any]] = {}


def _watched_pools(manager: Any) -> None:
    if not _POOLS:
        for scheme, pool in manager.pool_classes_by_scheme.items():
            _POOLS[scheme] = _watched_pool(pool)
    manager.pool_classes_by_scheme = _POOLS


class _WatchedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        _watched_pools(self.poolmanager)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        _watched_pools(manager)
        return manager


def interrupt() -> None:
    """End at once the exchange this thread is in, if any (for a signal handler: a blocking
    connect or read of the exchange would otherwise go on until its deadline). The caller of
    :func:`request` gets :class:`InterruptedTransferError`; outside an exchange it does
    nothing."""
    if getattr(_current, "interruptible", False):
        _current.interruptible = False
        raise _Interrupted


def watched(session: requests.Session) -> requests.Session:
    """``session``, its HTTP and HTTPS connections made watchable by :func:`request`."""
    for prefix in ("http://", "https://"):
        if not isinstance(session.get_adapter(prefix), _WatchedAdapter):
            session.mount(prefix, _WatchedAdapter())
    return session


# -- the request ----------------------------------------------------------------------------


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def request(session: requests.Session, method: str, url: str, *, deadline: float,
            max_bytes: int = MAX_ANSWER_BYTES, follow: bool = True,
            **kwargs: Any) -> requests.Response:
    """``method url`` through ``session``, its answer read whole (``response.content``).

    Raises :class:`DeadlineError` when the whole exchange (redirects included) takes longer
    than ``deadline`` seconds, :class:`AnswerTooLargeError` past ``max_bytes`` bytes of
    answer, :class:`RedirectRefusedError` for a redirect to another origin (scheme, host,
    port) than ``url``'s, :class:`CertificateError` when the server's certificate cannot be
    verified (against ``session.verify``, which ``$REQUESTS_CA_BUNDLE`` does not override),
    and other ``requests.RequestException`` as ``requests`` does. With ``follow`` false, a
    redirect is the answer (its Location is the caller's to judge).
    """
    watched(session)
    watch = _Watch()
    timer = threading.Timer(deadline, watch.expire)
    timer.daemon = True
    _current.watch = watch
    timer.start()
    try:
        try:
            _current.interruptible = True
            return _exchange(session, method, url, deadline, max_bytes, follow, kwargs)
        finally:
            _current.interruptible = False
    except _Interrupted:
        raise InterruptedTransferError(f"{method} {url}: given up, the pilot is stopping"
                                       ) from None
    except requests.exceptions.SSLError as exc:
        reason = tls.certificate_failure(exc)
        if reason is None or isinstance(exc, CertificateError):
            raise
        raise CertificateError(tls.failure_message(url, reason)) from exc
    except requests.RequestException as exc:
        if watch.expired and not isinstance(exc, TransferError):
            raise DeadlineError(f"{method} {url}: no complete answer within {deadline:g} s"
                                ) from exc
        raise
    finally:
        timer.cancel()
        _current.watch = None


def _exchange(session: requests.Session, method: str, url: str, deadline: float,
              max_bytes: int, follow: bool, kwargs: Mapping[str, Any]) -> requests.Response:
    home = origin(url)
    args = dict(kwargs)
    # Given with each request, the session's CAs win over $REQUESTS_CA_BUNDLE, which requests
    # would otherwise put in their place.
    args.setdefault("verify", session.verify)
    for _ in range(MAX_REDIRECTS + 1):
        response = session.request(method, url, timeout=deadline, stream=True,
                                   allow_redirects=False, **args)
        _read(response, method, url, max_bytes)
        if not follow or not response.is_redirect:
            return response
        target = urljoin(url, response.headers["Location"])
        if origin(target) != home:
            raise RedirectRefusedError(
                f"{method} {url}: redirected to {target[:200]}, away from the service "
                f"({home[0]}://{home[1]}:{home[2]}); not followed")
        code = response.status_code
        if (code in (302, 303) and method != "HEAD") or (code == 301 and method == "POST"):
            method = "GET"  # as browsers and requests do
            for name in ("data", "json", "files"):
                args.pop(name, None)
        url = target
    raise RedirectRefusedError(f"{method} {url}: more than {MAX_REDIRECTS} redirects")


def _read(response: requests.Response, method: str, url: str, max_bytes: int) -> None:
    too_large = AnswerTooLargeError(f"{method} {url}: the answer is larger than {max_bytes} "
                                    "bytes; not read further")
    with response:
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise too_large
        body = bytearray()
        for chunk in response.iter_content(_CHUNK):
            body += chunk
            if len(body) > max_bytes:
                raise too_large
    response._content = bytes(body)
    response._content_consumed = True  # type: ignore[attr-defined]
