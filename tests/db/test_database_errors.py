"""Database errors say what failed, not the values: no password, no job description."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from taskqueue.core.errors import ConfigurationError, DatabaseUnavailableError
from taskqueue.db.database import (
    LOST_AT_COMMIT,
    make_engine,
    make_session_factory,
    run_in_transaction,
)
from tests.conftest import Database

SECRET_JDL = '[Executable = "secret-payload-7f3a"]'


def test_a_failed_statement_does_not_carry_its_values(db: Database) -> None:
    with db.engine.connect() as conn, pytest.raises(DBAPIError) as failed:
        conn.execute(text("SELECT no_such_column FROM jobs WHERE description = :d"),
                     {"d": SECRET_JDL})
    assert "secret-payload" not in str(failed.value)


@pytest.mark.parametrize("url", ["oracle://scott:tiger-pw@host/db",
                                 "postgresql://scott:tiger-pw@:notaport/db"])
def test_a_refused_url_does_not_show_its_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        make_engine(url)
    assert "tiger-pw" not in str(refused.value) and "***" in str(refused.value)


def test_a_connection_lost_at_commit_is_not_run_again(db: Database) -> None:
    """The server may have applied a transaction whose connection broke while the COMMIT was
    on its way: the work is not run a second time, and the caller is told the outcome is
    unknown (a connection found dead before that is retried: test_database_restart)."""
    if not db.is_server:
        pytest.skip("SQLite runs in the process: no connection to lose")
    runs: list[int] = []

    def work(session: Session) -> str:
        runs.append(1)
        if db.backend == "postgresql":
            own = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
            ending = f"SELECT pg_terminate_backend({int(own)}, 10000)"
        else:
            own = session.execute(text("SELECT CONNECTION_ID()")).scalar_one()
            ending = f"KILL CONNECTION {int(own)}"
        with db.engine.connect() as other:
            other.execute(text(ending))
        return "stored"

    with pytest.raises(DatabaseUnavailableError) as lost:
        run_in_transaction(db.factory, work)
    assert runs == [1]
    assert str(lost.value) == LOST_AT_COMMIT
    assert run_in_transaction(db.factory, lambda s: s.execute(text("SELECT 1")).scalar_one()) == 1


def test_a_server_gone_read_only_is_left_for_a_fresh_connection(db: Database) -> None:
    """A primary demoted under its pooled connections (Patroni lost its leader key, or a
    balancer still sent to it) refuses every write as read-only: that is a lost connection,
    not an internal error. The transaction runs again on a fresh connection (the server
    changed nothing), and a server that stays read-only is a database unavailable."""
    if not db.is_server:
        pytest.skip("SQLite runs in the process: no server to lose")
    read_only = ("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"
                 if db.backend == "postgresql" else "SET SESSION TRANSACTION READ ONLY")
    engine = make_engine(db.url, pool_size=1)
    try:
        with engine.connect() as conn:  # the pool's one connection now acts as a standby's
            conn.execute(text(read_only))
            conn.commit()
        runs: list[int] = []

        def work(session: Session) -> int:
            runs.append(1)
            session.execute(text("UPDATE jobs SET status = status WHERE id = -1"))
            return len(runs)

        assert run_in_transaction(make_session_factory(engine), work) == 2
        assert runs == [1, 1]

        def always_read_only(session: Session) -> None:
            # Each transaction on each connection read-only, as on a standby.
            session.execute(text("SET TRANSACTION READ ONLY" if db.backend == "postgresql"
                                 else read_only))
            work(session)

        with pytest.raises(DatabaseUnavailableError, match="connection was lost"):
            run_in_transaction(make_session_factory(engine), always_read_only)
    finally:
        engine.dispose()
