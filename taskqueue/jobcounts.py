"""Jobs per VO and status, without counting the jobs table.

The database writes a row to ``job_count_deltas`` with every INSERT of jobs and every change
of a job's status (triggers, migration 0028), in the writer's own transaction. :func:`fold`
moves them into ``job_status_totals``: each batch of deltas is deleted and its sum added in
the same transaction, so that a delta is counted exactly once, and a delta whose writer has
not committed yet is left for a later fold (and never waited for). Deleting a job writes no
delta: a job the purge removed still counts in its last status.
"""

from __future__ import annotations

import json
from collections import Counter

from sqlalchemy import Connection, delete, select, text, update
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.orm import Session

from taskqueue.models import job_count_deltas_table, job_status_totals_table

#: Deltas folded per statement.
FOLD_BATCH = 5_000


def fold(session: Session) -> int:
    """Add the deltas written since the last fold to the totals; the number of deltas."""
    d = job_count_deltas_table.c
    conn = session.connection()
    sums: Counter[tuple[str, str]] = Counter()
    folded, after = 0, 0
    while True:
        # The deltas committed so far, locked so that no other fold takes them; those not yet
        # committed are skipped (a later fold takes them).
        rows = conn.execute(select(d.id, d.vo, d.status, d.jobs).where(d.id > after)
                            .order_by(d.id).limit(FOLD_BATCH)
                            .with_for_update(skip_locked=True)).all()
        if not rows:
            break
        after = rows[-1].id
        _delete(conn, [row.id for row in rows])
        folded += len(rows)
        for row in rows:
            sums[(row.vo, row.status)] += int(row.jobs)
        if len(rows) < FOLD_BATCH:
            break
    changed = sorted((key, n) for key, n in sums.items() if n)
    if changed:
        # Each (VO, status) row made if absent, then added to: two folds at once (each with
        # deltas of its own) both add, neither fails on the other's new row.
        conn.execute(_insert_if_absent(conn.dialect.name, [
            {"vo": vo, "status": status, "jobs": 0} for (vo, status), _ in changed]))
        t = job_status_totals_table.c
        for (vo, status), n in changed:
            conn.execute(update(job_status_totals_table)
                         .where(t.vo == vo, t.status == status).values(jobs=t.jobs + n))
    return folded


def totals(session: Session) -> dict[tuple[str, str], int]:
    """Jobs per (VO, status) as of the last :func:`fold`, purged jobs included; statuses
    with none left out."""
    t = job_status_totals_table.c
    return {(vo, status): int(n) for vo, status, n in
            session.execute(select(t.vo, t.status, t.jobs).where(t.jobs != 0))}


def _delete(conn: Connection, ids: list[int]) -> None:
    """Delete the deltas ``ids`` by their key alone. On MariaDB a plain ``id IN (...)`` may
    be run as a scan of the table (so for a small one), which waits for every row a writer
    has not committed yet; a join from the list of ids looks each one up."""
    if conn.dialect.name == "mysql":
        conn.execute(text(
            "DELETE d FROM JSON_TABLE(:ids, '$[*]' COLUMNS (id BIGINT PATH '$')) AS k "
            "STRAIGHT_JOIN job_count_deltas AS d ON d.id = k.id"), {"ids": json.dumps(ids)})
    else:
        conn.execute(delete(job_count_deltas_table)
                     .where(job_count_deltas_table.c.id.in_(ids)))


def _insert_if_absent(dialect: str, rows: list[dict[str, object]]
                      ) -> postgresql.Insert | sqlite.Insert | mysql.Insert:
    if dialect == "postgresql":
        return postgresql.insert(job_status_totals_table).values(rows).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sqlite.insert(job_status_totals_table).values(rows).on_conflict_do_nothing()
    return mysql.insert(job_status_totals_table).values(rows).prefix_with("IGNORE")
