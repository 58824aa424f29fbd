"""A client-side deadline for each statement on PostgreSQL, and a check that the server still
answers when a statement takes long.

The server's ``statement_timeout`` cannot fire on a server that is stopped (SIGSTOP, a frozen
virtual machine), and the kernel still acknowledges what is sent to it, so TCP keepalives and
``tcp_user_timeout`` do not fire either: a statement on a pooled connection would wait for as
long as the server is stopped. Here one thread for the whole process shuts down the socket of
a statement that outlived its deadline (the server's own timeout plus a margin): libpq then
sees the connection closed, the driver raises OperationalError, and the request is answered
503 "try again". MariaDB's client has a read timeout of its own (taskqueue.db.database).

The deadline is long (a statement may legitimately run for most of it). So a statement still
running ``liveness_after`` seconds after it was sent asks a liveness check (the process's
health probe, taskqueue.db.health, on a connection of its own) whether the server answers: if it
does not, the statement is given up at once; if it does, the statement goes on and is asked
about again every ``liveness_after`` seconds, up to its deadline. One check answers for every
statement that is due at the same time, on a thread of its own (a check may wait a few seconds
for a hung server; the deadlines do not wait for it).

:func:`socket_deadline` is the same thread's deadline for any socket (the exchange of the
matcher's health thread, gridpilot.worker).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import queue
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, event

#: Seconds past the server's statement timeout before the client gives the statement up (the
#: server's own cancellation, with its clearer error, comes first when the server runs).
MARGIN = 2.0


@dataclass(frozen=True)
class Limits:
    """What a statement may wait for: ``seconds`` at most (0: no limit), and past every
    ``liveness_after`` seconds (0: never) only while ``alive()`` says the server answers."""
    seconds: float = 0.0
    alive: Callable[[], bool] | None = None
    liveness_after: float = 0.0


@dataclass
class _Watched:
    fd: int
    deadline: float
    limits: Limits
    thread: int  # the thread that runs the statement


class _Deadlines:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []  # when something is due, and for which key
        self._live: dict[int, _Watched] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._checks: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._checker: threading.Thread | None = None
        #: Checks that said their server does not answer, and have not said it does since.
        self._down: set[Callable[[], bool]] = set()
        #: Threads whose last statement was given up here (not failed by the server).
        self._given_up: set[int] = set()

    def arm(self, fd: int, limits: Limits) -> int:
        with self._cond:
            key = next(self._keys)
            now = time.monotonic()
            thread = threading.get_ident()
            self._given_up.discard(thread)
            watched = _Watched(fd, now + limits.seconds, limits, thread)
            self._live[key] = watched
            self._push(key, watched, now, first=True)
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

    def known_down(self, alive: Callable[[], bool]) -> bool:
        """Whether the server does not answer, asked only while a check found it silent."""
        with self._cond:
            if alive not in self._down:
                return False
        answer = _answers(alive)
        with self._cond:
            if answer:
                self._down.discard(alive)
        return not answer

    def given_up(self) -> bool:
        """Whether the calling thread's last statement was given up here."""
        with self._cond:
            return threading.get_ident() in self._given_up

    def _push(self, key: int, watched: _Watched, now: float, *, first: bool = False) -> None:
        """Schedule the next thing due for ``key``: a liveness check (at once for a new
        statement while the server is known not to answer) or its deadline."""
        due = watched.deadline
        if watched.limits.alive is not None and watched.limits.liveness_after > 0:
            down = first and watched.limits.alive in self._down
            due = min(due, now if down else now + watched.limits.liveness_after)
        heapq.heappush(self._heap, (due, key))

    def _give_up(self, key: int) -> None:
        """Shut ``key``'s socket down; called locked."""
        watched = self._live.pop(key)
        self._given_up.add(watched.thread)
        _shut(watched.fd)

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                due, key = self._heap[0]
                now = time.monotonic()
                if due > now:
                    self._cond.wait(due - now)
                    continue
                heapq.heappop(self._heap)
                if now >= self._live[key].deadline:
                    self._give_up(key)
                else:
                    self._check_later(key)

    def _check_later(self, key: int) -> None:
        """Hand ``key`` to the liveness thread (started on first use); called locked."""
        self._checks.put(key)
        if self._checker is None:
            self._checker = threading.Thread(target=self._check, name="statement-liveness",
                                             daemon=True)
            self._checker.start()

    def _check(self) -> None:
        while True:
            keys = [self._checks.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    keys.append(self._checks.get_nowait())
            with self._cond:
                checks = {w.limits.alive for k in keys
                          if (w := self._live.get(k)) is not None and w.limits.alive}
            # One call of each check for all the statements due now, outside the lock.
            answers = {alive: _answers(alive) for alive in checks}
            with self._cond:
                for alive, answer in answers.items():
                    if answer:
                        self._down.discard(alive)
                    else:
                        self._down.add(alive)
                now = time.monotonic()
                for key in keys:
                    watched = self._live.get(key)
                    if watched is None or watched.limits.alive is None:
                        continue
                    if answers.get(watched.limits.alive, True):
                        self._push(key, watched, now)
                    else:
                        self._give_up(key)
                self._cond.notify()


def _answers(alive: Callable[[], bool]) -> bool:
    """What a liveness check says; a check that fails itself says nothing against the server."""
    try:
        return alive()
    except Exception:
        return True


def _shut(fd: int) -> None:
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=os.dup(fd))
        with sock:
            sock.shutdown(socket.SHUT_RDWR)


_DEADLINES = _Deadlines()


def _after_fork() -> None:
    # The threads do not follow a fork (gunicorn's workers are forked from a process that
    # may have started them): a child starts its own, and no deadline of the parent's.
    global _DEADLINES
    _DEADLINES = _Deadlines()


os.register_at_fork(after_in_child=_after_fork)
_KEY = "gridpilot_statement_deadline"
_LIMITS: weakref.WeakKeyDictionary[Engine, Limits] = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def socket_deadline(fd: int, limits: Limits) -> Iterator[None]:
    """Within the block, the socket of file descriptor ``fd`` is shut down when ``limits``
    say so (nothing for a negative ``fd`` or no limit)."""
    if limits.seconds <= 0 or fd < 0:
        yield
        return
    key = _DEADLINES.arm(fd, limits)
    try:
        yield
    finally:
        _DEADLINES.disarm(key)


def statement_deadline(dbapi_connection: Any, limits: Limits
                       ) -> contextlib.AbstractContextManager[None]:
    """Within the block, the psycopg connection's socket is shut down when ``limits`` say so."""
    pgconn = getattr(dbapi_connection, "pgconn", None)
    fd = getattr(pgconn, "socket", -1) if pgconn is not None else -1
    return socket_deadline(fd, limits)


def install(engine: Engine, statement_timeout: float, *,
            alive: Callable[[], bool] | None = None, liveness_after: float = 0.0) -> None:
    """Give every statement of the PostgreSQL ``engine`` a deadline of ``statement_timeout``
    plus MARGIN (nothing when the statement timeout is 0, no limit), and past every
    ``liveness_after`` seconds the check ``alive`` (true: the server answers)."""
    if statement_timeout <= 0:
        return
    limits = Limits(statement_timeout + MARGIN, alive, liveness_after)
    _LIMITS[engine] = limits

    def arm(info: dict[Any, Any], dbapi_connection: Any) -> None:
        disarm(info)
        manager = statement_deadline(dbapi_connection, limits)
        manager.__enter__()
        info[_KEY] = manager

    def disarm(info: dict[Any, Any]) -> None:
        manager = info.pop(_KEY, None)
        if manager is not None:
            manager.__exit__(None, None, None)

    @event.listens_for(engine, "before_cursor_execute")
    def _arm(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
             executemany: bool) -> None:
        arm(conn.info, conn.connection.dbapi_connection)

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        disarm(conn.info)

    @event.listens_for(engine, "handle_error")
    def _failed(context: Any) -> None:
        if context.connection is not None:
            disarm(context.connection.info)

    # COMMIT and ROLLBACK (and the pool's ROLLBACK when a connection comes back) are sent by
    # the driver, not by a cursor: their deadline runs until the connection goes back to the
    # pool, is invalidated, or runs its next statement.
    @event.listens_for(engine, "commit")
    def _commit(conn: Any) -> None:
        arm_ending(conn)

    @event.listens_for(engine, "rollback")
    def _rollback(conn: Any) -> None:
        arm_ending(conn)

    def arm_ending(conn: Any) -> None:
        # An invalidated connection sends nothing (and will not hand out its driver's).
        if not conn.invalidated and not conn.closed:
            arm(conn.info, conn.connection.dbapi_connection)

    @event.listens_for(engine, "reset")
    def _reset(dbapi_connection: Any, record: Any, reset_state: Any) -> None:
        if record is not None:
            arm(record.info, dbapi_connection)

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            disarm(record.info)

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, record: Any, cargs: Any, cparams: Any) -> None:
        # A new connection to a server that does not answer would wait for connect_timeout.
        if alive is not None and _DEADLINES.known_down(alive):
            raise dialect.loaded_dbapi.OperationalError(
                "the database does not answer its liveness check; no connection was tried")

    @event.listens_for(engine, "invalidate")
    def _invalidate(dbapi_connection: Any, record: Any, exception: Any) -> None:
        if record is not None:
            disarm(record.info)


def given_up() -> bool:
    """Whether the calling thread's last statement was given up by its deadline or because
    the server did not answer a liveness check (rather than failed by the server): a new
    connection to that server would not be answered either."""
    return _DEADLINES.given_up()


def limits_of(engine: Engine) -> Limits:
    """The client-side limits of one statement on ``engine`` (seconds 0: none)."""
    return _LIMITS.get(engine, Limits())
