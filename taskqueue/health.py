"""A database check that answers within a deadline, whatever the database does (/healthz).

The check runs ``SELECT 1`` on a fresh connection (never one of the request pool, which a hung
server may hold) in a thread of its own, and waits for it at most ``deadline`` seconds. A
check still waiting for a hung server is not started again: later calls answer at once that
the database has not answered yet, so a stopped server costs one thread and one connection
attempt per process, which end with the connect timeout or when the server answers.
"""

from __future__ import annotations

import threading

from sqlalchemy import Engine

from taskqueue.database import make_engine
from taskqueue.settings import DatabaseSettings

#: Seconds /healthz waits for the database.
DEADLINE = 1.0


class HealthProbe:
    def __init__(self, settings: DatabaseSettings, *, deadline: float = DEADLINE) -> None:
        self.deadline = deadline
        self._engine: Engine = make_engine(
            settings.url, pooled=False, connect_timeout=min(settings.connect_timeout, 2) or 2,
            statement_timeout=deadline, transaction_pooler=settings.transaction_pooler)
        self._lock = threading.Lock()
        self._pending: threading.Thread | None = None
        self._error: str | None = None

    def check(self) -> str | None:
        """None when the database answered within the deadline, else what went wrong."""
        with self._lock:
            if self._pending is not None and self._pending.is_alive():
                return (f"the database has not answered a check started more than "
                        f"{self.deadline:g} s ago")
            done = threading.Event()
            result: list[str | None] = []

            def probe() -> None:
                try:
                    conn = self._engine.raw_connection()
                    try:
                        cursor = conn.cursor()
                        cursor.execute("SELECT 1")
                        cursor.fetchall()
                        cursor.close()
                    finally:
                        conn.close()
                    result.append(None)
                except Exception as exc:  # any failure is the answer
                    result.append(f"the database does not answer: {type(exc).__name__}")
                done.set()

            thread = threading.Thread(target=probe, name="healthz", daemon=True)
            self._pending = thread
            thread.start()
        if not done.wait(self.deadline):
            return f"the database did not answer within {self.deadline:g} s"
        return result[0]

    def dispose(self) -> None:
        self._engine.dispose()
