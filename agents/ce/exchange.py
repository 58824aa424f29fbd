"""One HTTP exchange with an ARC-CE: within a deadline for the whole exchange, reading at most
so many bytes of answer (decoded: a small gzip answer may decode to gigabytes), and following
a redirect only when it stays at the CE's origin (scheme, host and port: never https to http,
never another host).

``requests``' timeout bounds each wait for a byte, not the whole answer: a CE trickling its
answer a byte at a time would hold the caller, and the director's turn, for ever. Here a timer
shuts the connection's socket down when the deadline passes, which ends a wait at once, in the
headers as in the body. The pilot has the same rules in ``pilot.transfer``; the agents may not
import the pilot package (docs/ARCHITECTURE.md), so the CE layer keeps its own.
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

#: Most bytes of one answer read by default.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: Most redirects followed (each within the CE's origin).
MAX_REDIRECTS = 5
_CHUNK = 64 * 1024


class ExchangeError(requests.RequestException):
    """The exchange was given up; the message says why."""


class DeadlineError(ExchangeError):
    """No complete answer within the deadline."""


class AnswerTooLargeError(ExchangeError):
    """The answer is larger than the caller reads."""


class RedirectRefusedError(ExchangeError):
    """The CE redirected to another origin than its own, or too often."""


_current = threading.local()


class _Watch:
    def __init__(self) -> None:
        self.lock = threading.Lock()
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


def _watched_pool(pool: type[Any]) -> type[Any]:
    """A subclass of one of urllib3's pool classes whose connections show their socket to the
    exchange's watch when they wait for an answer."""
    base = pool.ConnectionCls

    def getresponse(self: Any, *args: Any, **kwargs: Any) -> Any:
        watch: _Watch | None = getattr(_current, "watch", None)
        if watch is not None:
            watch.attach(self.sock)
        return base.getresponse(self, *args, **kwargs)

    connection = type(f"CeWatched{base.__name__}", (base,), {"getresponse": getresponse})
    return type(f"CeWatched{pool.__name__}", (pool,), {"ConnectionCls": connection})


_POOLS: dict[str, type[Any]] = {}
_POOLS_LOCK = threading.Lock()


def _watched_pools(manager: Any) -> None:
    with _POOLS_LOCK:
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


def watched(session: requests.Session) -> requests.Session:
    """``session``, its HTTP and HTTPS connections made watchable by :func:`request`."""
    for prefix in ("http://", "https://"):
        if not isinstance(session.get_adapter(prefix), _WatchedAdapter):
            session.mount(prefix, _WatchedAdapter())
    return session


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), port


def request(session: requests.Session, method: str, url: str, *, deadline: float,
            max_bytes: int = MAX_ANSWER_BYTES, truncate: bool = False,
            **kwargs: Any) -> requests.Response:
    """``method url`` through ``session``, its answer read whole (``response.content``).

    Raises :class:`DeadlineError` when the whole exchange (redirects included) takes longer
    than ``deadline`` seconds, :class:`AnswerTooLargeError` past ``max_bytes`` bytes of
    answer (with ``truncate``, the first ``max_bytes`` are the answer instead),
    :class:`RedirectRefusedError` for a redirect to another origin than ``url``'s, and other
    ``requests.RequestException`` as ``requests`` does.
    """
    watched(session)
    watch = _Watch()
    timer = threading.Timer(deadline, watch.expire)
    timer.daemon = True
    _current.watch = watch
    timer.start()
    try:
        return _exchange(session, method, url, deadline, max_bytes, truncate, kwargs)
    except requests.RequestException as exc:
        if watch.expired and not isinstance(exc, ExchangeError):
            raise DeadlineError(f"{method} {url}: no complete answer within {deadline:g} s"
                                ) from exc
        raise
    finally:
        timer.cancel()
        _current.watch = None


def _exchange(session: requests.Session, method: str, url: str, deadline: float,
              max_bytes: int, truncate: bool, kwargs: Mapping[str, Any]) -> requests.Response:
    home = origin(url)
    args = dict(kwargs)
    for _ in range(MAX_REDIRECTS + 1):
        response = session.request(method, url, timeout=deadline, stream=True,
                                   allow_redirects=False, **args)
        _read(response, method, url, max_bytes, truncate)
        if not response.is_redirect:
            return response
        target = urljoin(url, response.headers["Location"])
        if origin(target) != home:
            raise RedirectRefusedError(
                f"{method} {url}: redirected to {target[:200]!r}, away from the CE "
                f"({home[0]}://{home[1]}:{home[2]}); not followed")
        code = response.status_code
        if (code in (302, 303) and method != "HEAD") or (code == 301 and method == "POST"):
            method = "GET"
            for name in ("data", "json", "files"):
                args.pop(name, None)
        url = target
    raise RedirectRefusedError(f"{method} {url}: more than {MAX_REDIRECTS} redirects")


def _read(response: requests.Response, method: str, url: str, max_bytes: int,
          truncate: bool) -> None:
    too_large = AnswerTooLargeError(f"{method} {url}: the answer is larger than {max_bytes} "
                                    "bytes; not read further")
    with response:
        declared = response.headers.get("Content-Length", "")
        if not truncate and declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
            raise too_large
        body = bytearray()
        if method != "HEAD":
            for chunk in response.iter_content(_CHUNK):
                body += chunk
                if len(body) > max_bytes:
                    if truncate:
                        del body[max_bytes:]
                        break
                    raise too_large
    response._content = bytes(body)
    response._content_consumed = True  # type: ignore[attr-defined]
