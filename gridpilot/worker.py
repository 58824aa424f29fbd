"""The gunicorn worker of ``gridpilot serve``: gunicorn's threaded worker with one thread kept
for /healthz.

When the database hangs, every request thread may be waiting for it (up to the statement
deadline), and a balancer's health check queued behind them would time out: the balancer would
then see a process that does not answer instead of one that answers 503 at once. So each worker
has a second pool of one thread that serves only ``GET /healthz`` (and ``HEAD``), which answers
within its own deadline whatever the database does (taskqueue.health).

A request is sent to that thread when its first bytes, read without taking them from the socket
(``MSG_PEEK``), are such a request line. The listening socket waits for the first bytes before
it hands a connection over (Linux's ``TCP_DEFER_ACCEPT``), so the request line is there to
read. Anything else, or a request line not yet complete, or a TLS connection (whose bytes are
encrypted), goes to the request threads as before: the worst a wrong guess can do is to leave a
health check in the common queue. A pipelined request already read into gunicorn's buffer is
never re-routed.
"""

from __future__ import annotations

import socket
import ssl
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

#: Request lines served by the kept thread (followed by a space or a query).
HEALTH_REQUESTS = (b"GET /healthz", b"HEAD /healthz")
#: Bytes peeked: the longest prefix and the character after it.
_PEEK = max(map(len, HEALTH_REQUESTS)) + 1
#: Seconds the kernel waits for a new connection's first bytes before handing it over anyway.
DEFER_ACCEPT_SECONDS = 2


def asks_for_health(connection: Any) -> bool:
    """Whether the next request on gunicorn's connection is a health check (never waits)."""
    parser = getattr(connection, "parser", None)
    if parser is not None and parser.unreader.buf.getvalue():
        return False  # gunicorn has read ahead: the socket no longer holds the next request
    sock = getattr(connection, "sock", None)
    if not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket):
        return False
    try:
        head = sock.recv(_PEEK, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:  # nothing to read yet, or the connection is gone
        return False
    return any(head.startswith(line) and head[len(line):len(line) + 1] in (b" ", b"?")
               for line in HEALTH_REQUESTS)


class _RoutingPool:
    """What gunicorn's worker takes for its thread pool: requests go to the request threads,
    health checks to the kept thread."""

    def __init__(self, threads: int) -> None:
        self.requests = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="request")
        self.health = ThreadPoolExecutor(max_workers=1, thread_name_prefix="healthz")

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        pool = self.health if args and asks_for_health(args[0]) else self.requests
        return pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, **kwargs: Any) -> None:
        self.requests.shutdown(wait=wait, **kwargs)
        self.health.shutdown(wait=wait, **kwargs)


class MatcherWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's ``gthread`` worker with a thread kept for /healthz."""

    def init_process(self) -> None:
        defer = getattr(socket, "TCP_DEFER_ACCEPT", None)
        if defer is not None:
            for listener in self.sockets:
                raw = getattr(listener, "sock", listener)
                if raw.family in (socket.AF_INET, socket.AF_INET6):
                    raw.setsockopt(socket.IPPROTO_TCP, defer, DEFER_ACCEPT_SECONDS)
        super().init_process()

    def get_thread_pool(self) -> _RoutingPool:
        return _RoutingPool(self.cfg.threads)
