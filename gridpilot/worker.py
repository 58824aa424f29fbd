"""The gunicorn worker of ``gridpilot serve``: gunicorn's threaded worker with one thread kept
for /healthz, and a count of how long its request threads have had no room.

When the database hangs, every request thread may be waiting for it, and a balancer's health
check queued behind them would time out: the balancer would then see a process that does not
answer instead of one that answers 503 at once. So each worker has a second pool of one thread
that serves only ``GET /healthz`` (and ``HEAD``), which answers within its own deadline
whatever the database does (taskqueue.db.health).

A request is sent to that thread when its bytes, read without taking them from the socket
(``MSG_PEEK``), are such a request's whole head, with no body: the thread then never waits
for a client to send the rest, and a client trickling a health check's head cannot hold it
(it goes to the request threads). The listening socket waits for the first bytes before it
hands a connection over (Linux's ``TCP_DEFER_ACCEPT``). Anything else, or a head not yet
complete, or a TLS connection (whose bytes are encrypted), goes to the request threads as
before: the worst a wrong guess can do is to leave a health check in the common queue. A
pipelined request already read into gunicorn's buffer is never re-routed. The kept thread's
whole exchange has a deadline as well (HEALTH_EXCHANGE_SECONDS): past it the connection is
shut down.

The other way round, clients that hold every request thread (heads sent a byte at a time to
the port reached directly) would leave /healthz answering 200 while no request can be served:
the worker tells the app, in each request's WSGI environ (matcher.service.REQUEST_THREADS_STUCK),
for how long every request thread has been busy without one coming free, or a request has
waited for one, and /healthz fails past ``[matcher] starved_after``.

A client that sends part of a request and then stops (or trickles it a byte at a time) would
hold its request thread for as long as it likes, and a few such clients every thread. So each
request is given ``[matcher] read_timeout`` seconds from its first byte to its last (head and
body): the connection's socket (:class:`ReadDeadlineSocket`) bounds each read by what is left.
Past it the read finds the end of the stream, as when a client goes away, and the connection is
closed. The deadline starts afresh with each request of a kept-alive connection: the time it
idles between requests is gunicorn's keepalive's to bound, as before. gunicorn already hands a
new connection to a thread only once its first bytes are there (or puts it back to wait).
"""

from __future__ import annotations

import itertools
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

from matcher.service import REQUEST_THREADS_STUCK
from taskqueue.core.settings import MatcherSettings
from taskqueue.db import health
from taskqueue.db.statementdeadline import Limits, socket_deadline

#: Request lines served by the kept thread (followed by a space or a query).
HEALTH_REQUESTS = (b"GET /healthz", b"HEAD /healthz")
#: Bytes peeked: a health check's head is far shorter (a longer one goes to the request threads).
_PEEK = 4096
#: Seconds the kernel waits for a new connection's first bytes before handing it over anyway.
DEFER_ACCEPT_SECONDS = 2
#: Seconds the kept thread gives one exchange (the check's own deadline, and one more) before
#: it shuts the connection down.
HEALTH_EXCHANGE_SECONDS = health.DEADLINE + health.CONNECT_ALLOWANCE + 1.0


def asks_for_health(connection: Any) -> bool:
    """Whether the next request on gunicorn's connection is a health check whose whole head,
    and no body, is there to read (never waits)."""
    parser = getattr(connection, "parser", None)
    if parser is not None and parser.unreader.buf.getvalue():
        return False  # gunicorn has read ahead: the socket no longer holds the next request
    sock = getattr(connection, "sock", None)
    if not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket):
        return False
    try:
        peeked = sock.recv(_PEEK, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:  # nothing to read yet, or the connection is gone
        return False
    head, complete, _ = peeked.partition(b"\r\n\r\n")
    if not complete or not any(
            head.startswith(line) and head[len(line):len(line) + 1] in (b" ", b"?")
            for line in HEALTH_REQUESTS):
        return False
    return not _has_body(head.split(b"\r\n")[1:])


def _has_body(fields: Iterable[bytes]) -> bool:
    """Whether a head's fields announce a body (which the kept thread would wait for)."""
    for field in fields:
        name, _, value = field.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


class _RequestLoad:
    """Since when the request threads have had no room: all busy with none coming free, or
    a request waiting for one."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._lock = threading.Lock()
        self._busy = 0
        self._full_since: float | None = None
        self._waiting: dict[int, float] = {}  # ticket -> when it was queued, oldest first
        self._tickets = itertools.count()

    def queued(self) -> int:
        with self._lock:
            ticket = next(self._tickets)
            self._waiting[ticket] = time.monotonic()
            return ticket

    def running(self, ticket: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self._waiting.pop(ticket, None)
            self._busy += 1
            if self._busy >= self.threads:
                self._full_since = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            with self._lock:
                self._busy -= 1
                self._full_since = None

    def stuck_for(self) -> float:
        """Seconds without room for one more request (0: there is room)."""
        now = time.monotonic()
        with self._lock:
            full = now - self._full_since if self._full_since is not None else 0.0
            oldest = next(iter(self._waiting.values()), now)
        return max(full, now - oldest)


def _peer(client: Any) -> str:
    """A connection's peer as the log shows it."""
    if isinstance(client, tuple) and len(client) >= 2:
        return f"{client[0]}:{client[1]}"
    return str(client)


def _health_exchange(fn: Callable[..., Any], connection: Any, *args: Any) -> Any:
    """Serve one health check with a deadline for its whole exchange."""
    sock = getattr(connection, "sock", None)
    fd = sock.fileno() if isinstance(sock, socket.socket) else -1
    with socket_deadline(fd, Limits(HEALTH_EXCHANGE_SECONDS)):
        return fn(connection, *args)


class _RoutingPool:
    """What gunicorn's worker takes for its thread pool: requests go to the request threads,
    health checks to the kept thread."""

    def __init__(self, threads: int) -> None:
        self.requests = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="request")
        self.health = ThreadPoolExecutor(max_workers=1, thread_name_prefix="healthz")
        self.load = _RequestLoad(threads)

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        if args and asks_for_health(args[0]):
            return self.health.submit(_health_exchange, fn, *args, **kwargs)
        return self.requests.submit(self.load.running, self.load.queued(), fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, **kwargs: Any) -> None:
        self.requests.shutdown(wait=wait, **kwargs)
        self.health.shutdown(wait=wait, **kwargs)


class ReadDeadlineSocket(socket.socket):
    """A connection's socket whose reads of one request share a deadline: ``seconds`` from the
    first read of the request (:meth:`begin` starts a new one)."""

    seconds: float = 0.0
    #: When the request being read must have been read (None: its first read sets it).
    deadline: float | None = None
    #: Whether a read was refused because the deadline had passed.
    cut: bool = False

    @classmethod
    def adopt(cls, sock: socket.socket, seconds: float) -> ReadDeadlineSocket:
        """The same connection as ``sock`` (which is then detached), as a deadline socket."""
        timeout = sock.gettimeout()
        new = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        new.settimeout(timeout)
        new.seconds = seconds
        return new

    def begin(self) -> None:
        """A new request: its first read starts its deadline."""
        self.deadline = None
        self.cut = False

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        prior = self.gettimeout()
        if flags or prior == 0.0:  # a peek (routing), or a read that does not wait
            return super().recv(bufsize, flags)
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.seconds
        left = self.deadline - now
        if left > 0:
            self.settimeout(left if prior is None else min(prior, left))
            try:
                return super().recv(bufsize)
            except TimeoutError:
                if prior is not None and prior <= left:
                    raise  # the caller's own, shorter timeout
            finally:
                self.settimeout(prior)
        self.cut = True
        if prior is not None:
            raise TimeoutError("request read deadline passed")  # a caller that expects it
        return b""  # read as the end of the stream: the request is given up, as on a client gone


class MatcherWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's ``gthread`` worker with a thread kept for /healthz, and a read deadline for
    each request."""

    wsgi: Callable[..., Any]  # gunicorn's: the app, set by load_wsgi
    log: Any  # gunicorn's logger
    _read_timeout: float = MatcherSettings.read_timeout

    def read_timeout(self) -> float:
        """``[matcher] read_timeout`` of the application (gridpilot.server.MatcherServer)."""
        settings = getattr(self.app, "settings", None)
        if settings is None:
            return float(MatcherSettings.read_timeout)
        return float(settings.matcher.read_timeout)

    def enqueue_req(self, conn: Any) -> None:
        if not isinstance(conn.sock, ReadDeadlineSocket) and not conn.initialized:
            conn.sock = ReadDeadlineSocket.adopt(conn.sock, self._read_timeout)
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        sock = conn.sock
        if not isinstance(sock, ReadDeadlineSocket):
            return super().handle(conn)
        sock.begin()
        result = super().handle(conn)
        if sock.cut:
            self.log.warning("Closed the connection from %s: its request was not read within "
                             "%s s ([matcher] read_timeout)", _peer(conn.client),
                             sock.seconds)
            return False
        return result

    def init_process(self) -> None:
        self._read_timeout = self.read_timeout()
        defer = getattr(socket, "TCP_DEFER_ACCEPT", None)
        if defer is not None:
            for listener in self.sockets:
                raw = getattr(listener, "sock", listener)
                if raw.family in (socket.AF_INET, socket.AF_INET6):
                    raw.setsockopt(socket.IPPROTO_TCP, defer, DEFER_ACCEPT_SECONDS)
        super().init_process()

    def get_thread_pool(self) -> _RoutingPool:
        return _RoutingPool(self.cfg.threads)

    def load_wsgi(self) -> None:
        super().load_wsgi()
        app = self.wsgi
        load: _RequestLoad = self.tpool.load

        def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
            environ[REQUEST_THREADS_STUCK] = load.stuck_for()
            return app(environ, start_response)

        self.wsgi = wsgi
