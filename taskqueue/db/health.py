"""A database check that answers within a deadline, whatever the database does (/healthz).

One thread per process runs the checks, ``SELECT 1`` on a connection of its own that it keeps
between checks (never one of the request pool, which a hung server may hold). A caller waits
for its check at most ``deadline`` seconds, and a little longer when the thread has to make a
new connection first (a server under load may take a second to start a session; that is not
a hung database). Callers that come while a check is under way share its answer (a balancer's
check and a scrape at the same moment are one check); once its time is up, a check still
waiting for a hung server is not started again: later calls answer at once that the database
has not answered yet, so a stopped server costs one thread and one connection per process.
A kept connection that the server or a pooler closed while it sat idle is replaced at once
within the same check, so an idle timeout is never a failed check.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from taskqueue.core.settings import DatabaseSettings
from taskqueue.db.database import make_engine

#: Seconds /healthz waits for the database on a kept connection.
DEADLINE = 1.0
#: Seconds more it waits when the check has to connect first.
CONNECT_ALLOWANCE = 2.0


@dataclass
class _Ticket:
    """One check handed to the probe thread, and its answer."""
    done: threading.Event = field(default_factory=threading.Event)
    connecting: threading.Event = field(default_factory=threading.Event)
    result: str | None = None
    started: float = field(default_factory=time.monotonic)


class HealthProbe:
    def __init__(self, settings: DatabaseSettings, *, deadline: float = DEADLINE,
                 connect_allowance: float = CONNECT_ALLOWANCE) -> None:
        self.deadline = deadline
        self.connect_allowance = connect_allowance
        self._engine: Engine = make_engine(
            settings.url, pooled=False,
            connect_timeout=min(settings.connect_timeout, connect_allowance) or connect_allowance,
            statement_timeout=deadline, transaction_pooler=settings.transaction_pooler)
        self._lock = threading.Lock()
        self._tickets: queue.SimpleQueue[_Ticket | None] = queue.SimpleQueue()
        self._pending: _Ticket | None = None
        self._thread: threading.Thread | None = None
        self._connection: Any = None  # the kept DBAPI connection, used by the thread only

    def check(self) -> str | None:
        """None when the database answered within the deadline, else what went wrong."""
        with self._lock:
            pending = self._pending
            if pending is not None and not pending.done.is_set():
                if time.monotonic() >= self._give_up(pending):
                    return (f"the database has not answered a check started more than "
                            f"{self.deadline:g} s ago")
                ticket = pending  # a check under way: its answer is this one's too
            else:
                ticket = self._pending = _Ticket()
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="healthz",
                                                    daemon=True)
                    self._thread.start()
                self._tickets.put(ticket)
        while not ticket.done.wait(max(0.0, self._give_up(ticket) - time.monotonic())):
            if time.monotonic() >= self._give_up(ticket):  # connecting may extend it
                return f"the database did not answer within {self.deadline:g} s"
        return ticket.result

    def _give_up(self, ticket: _Ticket) -> float:
        """When a caller stops waiting for ``ticket``: the deadline after it started, and the
        connect allowance on top once the check had to connect."""
        extra = self.connect_allowance if ticket.connecting.is_set() else 0.0
        return ticket.started + self.deadline + extra

    def dispose(self) -> None:
        """Stop the probe thread (once its check, if any, ends) and close its connection."""
        with self._lock:
            if self._thread is not None:
                self._tickets.put(None)
                self._thread = None
        self._engine.dispose()

    def _run(self) -> None:
        while (ticket := self._tickets.get()) is not None:
            ticket.result = self._probe(ticket)
            ticket.done.set()
        self._drop()

    def _probe(self, ticket: _Ticket) -> str | None:
        if self._connection is not None:
            try:
                self._select_one(self._connection)
                return None
            except Exception:  # closed while idle, or hung: a new connection decides
                self._drop()
        ticket.connecting.set()
        try:
            self._connection = self._engine.raw_connection()
            self._select_one(self._connection)
            return None
        except Exception as exc:  # any failure is the answer
            self._drop()
            return f"the database does not answer: {type(exc).__name__}"

    @staticmethod
    def _select_one(connection: Any) -> None:
        cursor = connection.cursor()
        try:
            cursor.execute("SELECT 1")
            cursor.fetchall()
        finally:
            cursor.close()
        connection.rollback()  # never left idle in a transaction

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.invalidate()
