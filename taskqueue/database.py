"""Engines and sessions for the three supported databases.

PostgreSQL and MariaDB run at READ COMMITTED, so that each statement of a claim sees what other
transactions committed before it (see taskqueue.matching). SQLite takes its write lock at the
start of every transaction (``BEGIN IMMEDIATE``), because a transaction that reads first and
writes later can otherwise fail with "database is locked" whatever the busy timeout.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from taskqueue.errors import ConfigurationError, ConflictError

__all__ = ["Session", "SessionFactory", "make_engine", "make_session_factory",
           "run_in_transaction"]

T = TypeVar("T")
#: What makes sessions (and transactions, with ``.begin()``) on one engine.
SessionFactory = sessionmaker[Session]

#: Driver error codes that mean "the transaction lost a race; run it again".
_RETRYABLE_PG = {"40001", "40P01"}  # serialization failure, deadlock
_RETRYABLE_MYSQL = {1205, 1213}  # lock wait timeout, deadlock


def _redacted(url: str) -> str:
    """A URL that may not parse, with the password of its user:password@ part hidden."""
    return re.sub(r"(//[^/:@]*:)[^@/]*@", r"\1***@", url)


def make_engine(url: str, *, echo: bool = False, pool_size: int = 5) -> Engine:
    """An engine for ``url`` set up the way gridpilot's queries expect."""
    try:
        parsed = make_url(url)
    except Exception:  # sqlalchemy raises ArgumentError with a terse message
        raise ConfigurationError(f"database URL {_redacted(url)!r} is not a valid SQLAlchemy "
                                 "URL") from None
    shown = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, echo=echo, connect_args={"timeout": 60},
                               hide_parameters=True)
        _set_up_sqlite(engine)
        return engine
    if backend in ("postgresql", "mysql", "mariadb"):
        kwargs: dict[str, Any] = {}
        if backend != "postgresql":
            kwargs["connect_args"] = {"charset": "utf8mb4"}
        # No pre-ping: it costs a round trip on every checkout, i.e. on every claim. A
        # connection the server dropped fails one transaction, which invalidates the pool.
        return create_engine(
            url, echo=echo, isolation_level="READ COMMITTED", pool_size=pool_size,
            max_overflow=pool_size, pool_recycle=3600,
            # A failed statement's error (and log line) names it, not its values: those are
            # job descriptions, tokens' subjects, reasons.
            hide_parameters=True, **kwargs,
        )
    raise ConfigurationError(
        f"database URL {shown!r}: backend {backend!r} is not supported; "
        "use sqlite, postgresql+psycopg or mysql+pymysql"
    )


def _set_up_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" below issue BEGIN itself instead of the driver.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def is_retryable(exc: BaseException) -> bool:
    """Whether a database error means a lost race (deadlock, serialisation) worth retrying."""
    if not isinstance(exc, DBAPIError) or exc.orig is None:
        return False
    orig = exc.orig
    code = getattr(orig, "sqlstate", None)
    if code in _RETRYABLE_PG:
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _RETRYABLE_MYSQL:
        return True
    return isinstance(exc, OperationalError) and "database is locked" in str(orig)


def run_in_transaction(factory: sessionmaker[Session], work: Callable[[Session], T], *,
                       attempts: int = 5) -> T:
    """Run ``work`` in one transaction, again from the start if it lost a race."""
    for attempt in range(1, attempts + 1):
        try:
            with factory.begin() as session:
                return work(session)
        except DBAPIError as exc:
            if not is_retryable(exc) or attempt == attempts:
                if is_retryable(exc):
                    raise ConflictError(
                        f"the transaction lost {attempts} races in a row with other "
                        "processes; try again"
                    ) from exc
                raise
    raise AssertionError("unreachable")
