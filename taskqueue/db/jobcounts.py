"""Jobs per VO and status, and waiting jobs per task queue, without counting the jobs tables.

The database writes a row to ``job_count_deltas`` with every INSERT of jobs and every change
of a job's status, and one to ``tq_waiting_deltas`` with every job put in or taken out of a
task queue (triggers, migration 0028), in the writer's own transaction. :func:`fold` moves
them into ``job_status_totals`` and ``tq_waiting``: each batch of deltas is deleted and its sum
added in the same transaction, so that a delta is counted exactly once, and a delta whose
writer has not committed yet is left for a later fold (and never waited for). Deleting a job
writes no delta: a job the purge removed still counts in its last status.
"""

from __future__ import annotations

import functools
import json
import time
from collections import Counter
from dataclasses import dataclass

from sqlalchemy import Connection, Table, TextClause, delete, select, text
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.orm import Session

from taskqueue.db.models import (
    job_count_deltas_table,
    job_status_totals_table,
    tq_waiting_deltas_table,
    tq_waiting_table,
)

#: Deltas folded per statement (read out of the server, or on PostgreSQL summed in it).
FOLD_BATCH = 5_000
PG_FOLD_BATCH = 100_000
#: Totals added to per statement (two parameters each).
ADD_BATCH = 1_000
#: A fold starts no batch after this many seconds: deltas piled up while no activity loop ran
#: (a day of claims is tens of millions) are folded over several turns, each statement well
#: inside the statement timeout, instead of one statement that the timeout cuts every turn.
FOLD_SECONDS = 5.0


@dataclass(frozen=True)
class _Count:
    """Deltas and the totals they fold into, keyed by ``keys``."""

    deltas: Table
    totals: Table
    keys: tuple[str, ...]


_STATUS = _Count(job_count_deltas_table, job_status_totals_table, ("vo", "status"))
_WAITING = _Count(tq_waiting_deltas_table, tq_waiting_table, ("tq_id",))


def fold(session: Session) -> int:
    """Add the deltas written since the last fold to the totals, for up to about
    :data:`FOLD_SECONDS` (the rest at the next fold); the number of deltas folded."""
    conn = session.connection()
    stop_at = time.monotonic() + FOLD_SECONDS
    folded = _fold(conn, _STATUS, stop_at) + _fold(conn, _WAITING, stop_at)
    # A queue with no job left has no row (the cleanup loop deletes emptied queues).
    conn.execute(delete(tq_waiting_table).where(tq_waiting_table.c.jobs == 0))
    return folded


def totals(session: Session) -> dict[tuple[str, str], int]:
    """Jobs per (VO, status) as of the last :func:`fold`, purged jobs included; statuses
    with none left out."""
    t = job_status_totals_table.c
    return {(vo, status): int(n) for vo, status, n in
            session.execute(select(t.vo, t.status, t.jobs).where(t.jobs != 0))}


def waiting(session: Session) -> dict[int, int]:
    """Jobs waiting in each non-empty task queue as of the last :func:`fold`."""
    t = tq_waiting_table.c
    return {int(tq_id): int(n) for tq_id, n in
            session.execute(select(t.tq_id, t.jobs).where(t.jobs > 0))}


def _fold(conn: Connection, count: _Count, stop_at: float) -> int:
    if conn.dialect.name == "postgresql":
        folded = 0
        while True:
            n = int(conn.execute(_pg_fold(count), {"n": PG_FOLD_BATCH}).scalar_one())
            folded += n
            if n < PG_FOLD_BATCH or time.monotonic() >= stop_at:
                return folded
    d = count.deltas.c
    keys = [d[k] for k in count.keys]
    sums: Counter[tuple[object, ...]] = Counter()
    folded, after = 0, 0
    while True:
        # The deltas committed so far, locked so that no other fold takes them; those not yet
        # committed are skipped (a later fold takes them).
        rows = conn.execute(select(d.id, d.jobs, *keys).where(d.id > after)
                            .order_by(d.id).limit(FOLD_BATCH)
                            .with_for_update(skip_locked=True)).all()
        if not rows:
            break
        after = rows[-1].id
        _delete(conn, count.deltas, [row.id for row in rows])
        folded += len(rows)
        for row in rows:
            sums[tuple(row[2:])] += int(row.jobs)
        if len(rows) < FOLD_BATCH or time.monotonic() >= stop_at:
            break
    changed = [{**dict(zip(count.keys, key, strict=True)), "jobs": n}
               for key, n in sorted(sums.items()) if n]
    for start in range(0, len(changed), ADD_BATCH):
        conn.execute(_add(conn.dialect.name, count, changed[start:start + ADD_BATCH]))
    return folded


@functools.cache
def _pg_fold(count: _Count) -> TextClause:
    """PostgreSQL: a batch of ``:n`` deltas folded in one statement, never leaving the
    server (0.38 s for 100,000; read out and deleted by id, 5,000 at a time, they took
    1.9 s)."""
    keys = ", ".join(count.keys)
    deltas, totals = count.deltas.name, count.totals.name
    return text(f"""
        WITH gone AS (
            DELETE FROM {deltas} WHERE id IN (
                SELECT id FROM {deltas} ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED)
            RETURNING {keys}, jobs),
        added AS (
            INSERT INTO {totals} ({keys}, jobs)
            SELECT {keys}, sum(jobs) FROM gone GROUP BY {keys} HAVING sum(jobs) <> 0
            ON CONFLICT ({keys}) DO UPDATE SET jobs = {totals}.jobs + EXCLUDED.jobs
            RETURNING 1)
        SELECT count(*) FROM gone""")


def _delete(conn: Connection, table: Table, ids: list[int]) -> None:
    """Delete the deltas ``ids`` by their key alone. On MariaDB a plain ``id IN (...)`` may
    be run as a scan of the table (so for a small one), which waits for every row a writer
    has not committed yet; a join from the list of ids looks each one up."""
    if conn.dialect.name == "mysql":
        conn.execute(text(
            "DELETE d FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS k "
            f"STRAIGHT_JOIN {table.name} AS d ON d.id = k.id"), {"ids": json.dumps(ids)})
    else:
        conn.execute(delete(table).where(table.c.id.in_(ids)))


def _add(dialect: str, count: _Count, rows: list[dict[str, object]]
         ) -> postgresql.Insert | sqlite.Insert | mysql.Insert:
    """Add each row's ``jobs`` to its total, made if absent, in one statement: two folds at
    once (each with deltas of its own) both add, neither fails on the other's new row."""
    table = count.totals
    if dialect == "mysql":
        stmt = mysql.insert(table).values(rows)
        return stmt.on_duplicate_key_update(jobs=table.c.jobs + stmt.inserted.jobs)
    upsert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt2 = upsert(table).values(rows)
    return stmt2.on_conflict_do_update(index_elements=list(count.keys),
                                       set_={"jobs": table.c.jobs + stmt2.excluded.jobs})
