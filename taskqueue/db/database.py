"""Engines and sessions for the three supported databases.

PostgreSQL and MariaDB run at READ COMMITTED, so that each statement of a claim sees what other
transactions committed before it (see taskqueue.matching.claim). SQLite takes its write lock at the
start of every transaction (``BEGIN IMMEDIATE``), because a transaction that reads first and
writes later can otherwise fail with "database is locked" whatever the busy timeout.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from taskqueue.core.errors import ConfigurationError, ConflictError, DatabaseUnavailableError
from taskqueue.core.settings import DatabaseSettings
from taskqueue.db.statementdeadline import given_up
from taskqueue.db.statementdeadline import install as install_deadline

__all__ = ["Session", "SessionFactory", "engine_for", "make_engine", "make_session_factory",
           "run_in_transaction"]

T = TypeVar("T")
#: What makes sessions (and transactions, with ``.begin()``) on one engine.
SessionFactory = sessionmaker[Session]

#: What a caller is told when the database cannot be reached or did not answer in time.
UNAVAILABLE = ("the database did not answer in time; nothing was changed, try again in a few "
               "seconds")
#: What a caller is told when the connection broke under the transaction (a restart).
LOST = ("the database connection was lost; nothing was changed, try again in a few seconds")
#: What a caller is told when the connection broke while the transaction was committing.
LOST_AT_COMMIT = ("the database connection was lost while the change was being committed; it "
                  "may or may not have been stored: look before trying again")
#: Driver error codes that mean "the transaction lost a race; run it again".
_RETRYABLE_PG = {"40001", "40P01"}  # serialization failure, deadlock
_RETRYABLE_MYSQL = {1205, 1213}  # lock wait timeout, deadlock
#: Driver error codes of a write refused by a server that is read-only: a standby, e.g. a
#: primary demoted under its pooled connections when its HA manager (Patroni) lost the
#: leader key, or a member a balancer still sends to for a moment after a failover. The
#: server changed nothing; the connection is treated as lost, so that the next one is made
#: anew (through the balancer, to the new primary).
_READ_ONLY_PG = {"25006"}  # read_only_sql_transaction
_READ_ONLY_MYSQL = {1290, 1792}  # --read-only server, read-only transaction


def _redacted(url: str) -> str:
    """A URL that may not parse, with the password of its user:password@ part hidden."""
    return re.sub(r"(//[^/:@]*:)[^@/]*@", r"\1***@", url)


#: Defaults of the timeouts, in seconds (``[database]`` settings override them).
CONNECT_TIMEOUT = DatabaseSettings.connect_timeout
POOL_TIMEOUT = DatabaseSettings.pool_timeout
STATEMENT_TIMEOUT = DatabaseSettings.statement_timeout
LIVENESS_AFTER = DatabaseSettings.liveness_after


def make_engine(url: str, *, echo: bool = False, pool_size: int = 5,
                connect_timeout: float = CONNECT_TIMEOUT, pool_timeout: float = POOL_TIMEOUT,
                statement_timeout: float = STATEMENT_TIMEOUT, pooled: bool = True,
                autocommit: bool = False, transaction_pooler: bool = False,
                liveness: Callable[[], bool] | None = None,
                liveness_after: float = LIVENESS_AFTER) -> Engine:
    """An engine for ``url`` set up the way gridpilot's queries expect.

    A hung or unreachable server fails a transaction instead of holding it forever: a new
    connection must be made within ``connect_timeout`` seconds, a pooled one handed out within
    ``pool_timeout``, and the server cancels a statement after ``statement_timeout`` seconds
    (PostgreSQL ``statement_timeout``, MariaDB ``max_statement_time``; 0: no limit). MariaDB's
    client also stops waiting for an answer a little after that. ``pooled`` false: a fresh
    connection each time (health checks). ``autocommit`` (servers only): each statement is its
    own transaction, and a connection goes back to the pool without a reset (the claim
    function's calls, taskqueue.pilots.pilotmatch, leave nothing open). ``transaction_pooler``
    (PostgreSQL behind PgBouncer in transaction mode): no statement prepared on the server
    and no startup option, so no statement timeout from here (the server's own holds).

    ``liveness`` (PostgreSQL): a check that the server answers (true), made on a connection of
    its own (the process's health probe) when a statement has run ``liveness_after`` seconds
    and every ``liveness_after`` seconds after: a statement whose server does not answer is
    given up then, not at its deadline (taskqueue.db.statementdeadline)."""
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
                               hide_parameters=True,
                               **({} if pooled else {"poolclass": NullPool}))
        _set_up_sqlite(engine)
        return engine
    if backend in ("postgresql", "mysql", "mariadb"):
        connect_args = _server_connect_args(backend, connect_timeout, statement_timeout)
        if transaction_pooler and backend == "postgresql":
            # A pooler in transaction mode runs each transaction on any of its server
            # connections: a statement psycopg prepared on one is unknown on the next (and
            # PgBouncer before 1.21 refuses startup options).
            connect_args["prepare_threshold"] = None
            connect_args.pop("options", None)
        pooling: dict[str, Any] = (
            {"pool_size": pool_size, "max_overflow": pool_size, "pool_recycle": 3600,
             "pool_timeout": pool_timeout} if pooled else {"poolclass": NullPool})
        # No pre-ping: it costs a round trip on every checkout, i.e. on every claim. A
        # connection the server dropped fails one transaction, which invalidates the pool.
        # A failed statement's error (and log line) names it, not its values: those are job
        # descriptions, tokens' subjects, reasons.
        if autocommit:
            pooling["pool_reset_on_return"] = None
        engine = create_engine(url, echo=echo,
                               isolation_level="AUTOCOMMIT" if autocommit else "READ COMMITTED",
                               hide_parameters=True, connect_args=connect_args, **pooling)
        _read_only_is_a_lost_connection(engine)
        if backend == "postgresql":
            # Also behind a pooler, whose server-side timeout is the server's own setting.
            install_deadline(engine, statement_timeout, alive=liveness,
                             liveness_after=liveness_after)
        return engine
    raise ConfigurationError(
        f"database URL {shown!r}: backend {backend!r} is not supported; "
        "use sqlite, postgresql+psycopg or mysql+pymysql"
    )


def is_read_only_server(exc: BaseException) -> bool:
    """Whether a driver error (or SQLAlchemy's wrapping of one) is a write refused because
    the server is read-only (a standby): see ``_READ_ONLY_PG``."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if getattr(orig, "sqlstate", None) in _READ_ONLY_PG:
        return True
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    return bool(args) and isinstance(args[0], int) and args[0] in _READ_ONLY_MYSQL


def _read_only_is_a_lost_connection(engine: Engine) -> None:
    """A connection to a server that went read-only is invalidated, with the pool's others
    of its age (they reach the same server): run_in_transaction then retries on a fresh
    one, and a caller that still gets the error is told the database is unavailable."""

    @event.listens_for(engine, "handle_error")
    def _read_only(context: Any) -> None:
        if is_read_only_server(context.original_exception):
            context.is_disconnect = True


def _server_connect_args(backend: str, connect_timeout: float, statement_timeout: float
                         ) -> dict[str, Any]:
    # libpq and PyMySQL take whole seconds; 0 would mean "wait forever" to libpq.
    connect = max(1, math.ceil(connect_timeout)) if connect_timeout > 0 else 0
    if backend == "postgresql":
        args: dict[str, Any] = {"connect_timeout": connect}
        if statement_timeout > 0:
            args["options"] = f"-c statement_timeout={int(statement_timeout * 1000)}"
        return args
    args = {"charset": "utf8mb4"}
    if connect:
        args["connect_timeout"] = connect
    if statement_timeout > 0:
        args["init_command"] = f"SET SESSION max_statement_time={float(statement_timeout)}"
        # The server stops the statement; the client gives up too if the server itself hangs.
        args["read_timeout"] = args["write_timeout"] = math.ceil(statement_timeout) + 10
    return args


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


def engine_for(settings: DatabaseSettings, *, pool_size: int = 5,
               statement_timeout: float | None = None, autocommit: bool = False,
               liveness: Callable[[], bool] | None = None) -> Engine:
    """The engine the ``[database]`` settings describe (``statement_timeout`` overrides the
    setting, e.g. 0 for schema migrations; ``liveness``: see :func:`make_engine`)."""
    return make_engine(
        settings.url, echo=settings.echo, pool_size=pool_size,
        connect_timeout=settings.connect_timeout, pool_timeout=settings.pool_timeout,
        autocommit=autocommit, transaction_pooler=settings.transaction_pooler,
        liveness=liveness, liveness_after=settings.liveness_after,
        statement_timeout=(settings.statement_timeout if statement_timeout is None
                           else statement_timeout))


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
    """Run ``work`` in one transaction, again from the start if it lost a race, and once more
    on a fresh connection when the one it had was dead (the server restarted since it was
    pooled: the pool drops the others of its age as well).

    A connection lost while the COMMIT was on its way is never retried: the server may have
    applied the transaction before it went, and running ``work`` again could apply it twice.
    The caller is told that the outcome is unknown."""
    reconnected = False
    for attempt in range(1, attempts + 1):
        committing = False
        try:
            with factory.begin() as session:
                result = work(session)
                session.flush()
                committing = True  # leaving the block commits
            return result
        except DBAPIError as exc:
            if exc.connection_invalidated and committing:
                raise DatabaseUnavailableError(LOST_AT_COMMIT) from exc
            if exc.connection_invalidated and given_up():
                # Given up here: the server did not answer, and would not answer a new
                # connection either (which would wait for connect_timeout first).
                raise DatabaseUnavailableError(UNAVAILABLE) from exc
            if exc.connection_invalidated and not reconnected:
                reconnected = True
                continue
            if exc.connection_invalidated:
                raise DatabaseUnavailableError(LOST) from exc
            if not is_retryable(exc) or attempt == attempts:
                if is_retryable(exc):
                    raise ConflictError(
                        f"the transaction lost {attempts} races in a row with other "
                        "processes; try again"
                    ) from exc
                if isinstance(exc, OperationalError):
                    raise DatabaseUnavailableError(UNAVAILABLE) from exc
                raise
        except PoolTimeoutError as exc:
            raise DatabaseUnavailableError(UNAVAILABLE) from exc
    raise DatabaseUnavailableError(LOST)  # the last attempt went to a fresh connection
