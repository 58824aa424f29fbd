"""A client-side deadline for each statement on PostgreSQL.

The server's ``statement_timeout`` cannot fire on a server that is stopped (SIGSTOP, a frozen
virtual machine), and the kernel still acknowledges what is sent to it, so TCP keepalives and
``tcp_user_timeout`` do not fire either: a statement on a pooled connection would wait for as
long as the server is stopped. Here one thread for the whole process shuts down the socket of
a statement that outlived its deadline (the server's own timeout plus a margin): libpq then
sees the connection closed, the driver raises OperationalError, and the request is answered
503 "try again". MariaDB's client has a read timeout of its own (taskqueue.database).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine, event

#: Seconds past the server's statement timeout before the client gives the statement up (the
#: server's own cancellation, with its clearer error, comes first when the server runs).
MARGIN = 2.0


class _Deadlines:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, int] = {}  # key -> socket file descriptor
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, fd: int, seconds: float) -> int:
        with self._cond:
            key = next(self._keys)
            heapq.heappush(self._heap, (time.monotonic() + seconds, key))
            self._live[key] = fd
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="statement-deadlines",
                                                daemon=True)
                self._thread.start()
            elif self._heap[0][1] == key:
                self._cond.notify()
            return key

    def disarm(self, key: int) -> None:
        with self._cond:
            self._live.pop(key, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                due, key = self._heap[0]
                left = due - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                _shut(self._live.pop(key))


def _shut(fd: int) -> None:
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        with sock:
            sock.shutdown(socket.SHUT_RDWR)


_DEADLINES = _Deadlines()


def _after_fork() -> None:
    # The thread does not follow a fork (gunicorn's workers are forked from a process that
    # may have started it): a child starts its own, and no deadline of the parent's.
    global _DEADLINES
    _DEADLINES = _Deadlines()


os.register_at_fork(after_in_child=_after_fork)
_KEY = "gridpilot_statement_deadline"
_SECONDS: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def statement_deadline(dbapi_connection: Any, seconds: float) -> Iterator[None]:
    """Within the block, the psycopg connection's socket is shut down after ``seconds``."""
    pgconn = getattr(dbapi_connection, "pgconn", None)
    fd = getattr(pgconn, "socket", -1) if pgconn is not None else -1
    if seconds <= 0 or fd < 0:
        yield
        return
    key = _DEADLINES.arm(fd, seconds)
    try:
        yield
    finally:
        _DEADLINES.disarm(key)


def install(engine: Engine, statement_timeout: float) -> None:
    """Give every statement of the PostgreSQL ``engine`` a deadline of ``statement_timeout``
    plus MARGIN (nothing when the statement timeout is 0, no limit)."""
    if statement_timeout <= 0:
        return
    seconds = statement_timeout + MARGIN
    _SECONDS[engine] = seconds

    @event.listens_for(engine, "before_cursor_execute")
    def _arm(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
             executemany: bool) -> None:
        manager = statement_deadline(conn.connection.dbapi_connection, seconds)
        manager.__enter__()
        conn.info[_KEY] = manager

    def _disarm(conn: Any) -> None:
        manager = conn.info.pop(_KEY, None)
        if manager is not None:
            manager.__exit__(None, None, None)

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        _disarm(conn)

    @event.listens_for(engine, "handle_error")
    def _failed(context: Any) -> None:
        if context.connection is not None:
            _disarm(context.connection)


def deadline_of(engine: Engine) -> float:
    """The client-side deadline of one statement on ``engine`` (0: none)."""
    return _SECONDS.get(engine, 0.0)
