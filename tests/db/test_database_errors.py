"""Database errors say what failed, not the values: no password, no job description."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from taskqueue.database import make_engine
from taskqueue.errors import ConfigurationError
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
