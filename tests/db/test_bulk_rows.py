"""taskqueue.db.bulk's many-row inserts (an unnest on PostgreSQL, one JSON document on MariaDB,
executemany on SQLite) store every value as a one-row INSERT would, and hand the ids back in
the rows' order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError

from taskqueue.db.bulk import insert_rows, insert_rows_returning_ids
from taskqueue.db.models import history_table, jobs_table
from tests.conftest import Database

HOSTILE = ["plain", "quote ' and \" both", "back\\slash \\\\ and \\u00e9 as text", "émoji 🚀 ünï",
           "percent %s %(x)s and :name", '{"json": [1, 2]}', "new\nline\ttab", "", "x" * 255,
           "null", "$[0]"]


def _job(i: int, text: str, now: datetime) -> dict[str, object]:
    return {"vo": "lhcb", "owner": text[:255] or "o", "owner_group": "g", "status": "Waiting",
            "minor_status": text[:255], "description": f"[Executable = \"{i}\"; X = {text!r}]",
            "description_format": "jdl", "bulk_index": None if i % 2 else i,
            "job_type": "User", "user_priority": -i, "cpu_time": 2**40 + i, "processors": 1,
            "memory": 0, "submit_pool": None, "submitted_at": now + timedelta(microseconds=i),
            "reschedule_count": 0, "job_name": text[:255] or None, "job_group": None}


def test_many_rows_keep_every_value_and_their_order(db: Database) -> None:
    now = datetime(2026, 11, 28, 12, 0, 0, 123456, tzinfo=UTC)
    rows = [_job(i, text, now) for i, text in enumerate(HOSTILE * 3)]
    with db.factory.begin() as s:
        ids = insert_rows_returning_ids(s.connection(), jobs_table, rows)
        insert_rows(s.connection(), history_table, [
            {"job_id": job_id, "at": now, "status": "Waiting", "minor_status": row["minor_status"],
             "source": "test"} for job_id, row in zip(ids, rows, strict=True)])
    assert ids == sorted(ids) and len(set(ids)) == len(rows)
    j = jobs_table.c
    with db.factory() as s:
        stored = {row.id: row for row in s.execute(select(jobs_table).where(j.id.in_(ids)))}
        history = {job_id: minor for job_id, minor in s.execute(
            select(history_table.c.job_id, history_table.c.minor_status))}
    for job_id, row in zip(ids, rows, strict=True):
        got = stored[job_id]
        for name, value in row.items():
            assert getattr(got, name) == value, (name, value)
        assert history[job_id] == row["minor_status"]


@pytest.mark.parametrize("wrong", [{"owner": "o" * 256}, {"bulk_index": 2**40}])
def test_a_value_too_big_for_its_column_is_refused_not_cut(db: Database,
                                                           wrong: dict[str, object]) -> None:
    """As in a one-row INSERT, a value too long or too large for its column is the database's
    error (SQLite, which enforces neither, stores it whole), never a shorter value or NULL."""
    now = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    rows = [_job(i, "ok", now) for i in range(6)]
    rows[3] = {**rows[3], **wrong}
    name, value = next(iter(wrong.items()))
    with db.factory.begin() as s:
        if db.backend == "sqlite":
            ids = insert_rows_returning_ids(s.connection(), jobs_table, rows)
            assert s.scalar(select(jobs_table.c[name]).where(jobs_table.c.id == ids[3])) == value
            return
    with pytest.raises(DBAPIError), db.factory.begin() as s:
        insert_rows_returning_ids(s.connection(), jobs_table, rows)
    with db.factory() as s:
        assert s.scalar(select(func.count()).select_from(jobs_table)) == 0
