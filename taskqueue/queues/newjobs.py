"""PostgreSQL: new jobs, their status history and their task-queue rows in one statement.

A submission used to cost a statement per table (the jobs with RETURNING, then the history
fed the ids, then the queue rows), each a round trip and each built from one Python dict per
row. Here the rows travel as one array per column that varies between them (a column every job
shares, the usual case in a bulk, is one scalar), and data-modifying CTEs write the three
tables: the jobs are inserted in array order, so the sequence hands them ascending ids in that
order (other inserters' ids may interleave, never reorder ours), and each job's place in the
arrays is its rank among the ids returned.

Each array is sent as one JSON text that the statement reads back with
``json_array_elements_text`` and casts to its column's type: psycopg writes a Python list as
a PostgreSQL array one element at a time in Python, which was a third of a 1,000-job bulk's
time in the service; the json module writes the same list in C, a hundred times faster.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Column, Connection, TextClause, TypeDecorator, text
from sqlalchemy.dialects import postgresql

from taskqueue.db.models import (
    UTCDateTime,
    history_table,
    jobs_table,
    task_queues_table,
    tq_jobs_table,
)

_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]
_UTC = UTCDateTime()


@dataclass
class QueueRefill:
    """The one queue a submission's waiting jobs go to, when the statement that stores the
    jobs also folds them into the queue's statistics (as
    :func:`taskqueue.queues.taskqueues.reserve_queues` would for an active queue: the same
    arithmetic in the same order) and writes their queue rows. The statement sets ``tq_id`` when the
    queue was active and took the jobs; otherwise (a queue to create or reactivate) the caller locks
    it with :func:`taskqueue.queues.taskqueues.lock_planned` and writes the queue rows itself."""

    digest: str
    count: int
    priority_sum: int
    tq_id: int | None = None


def insert_new_jobs(conn: Connection, rows: Sequence[Mapping[str, Any]], *, now: datetime,
                    histories: Sequence[tuple[int, str, str, str]],
                    queues: Sequence[tuple[int, int] | None] | None,
                    refill: QueueRefill | None = None) -> list[int]:
    """Insert ``rows`` into jobs (dicts with the same keys), the ``histories`` rows (job's
    place in ``rows``, status, minor status, source; inserted in the order given, all at
    ``now``) and a ``task_queue_jobs`` row (queue, rank) for each job that has one in
    ``queues``. With ``refill``, the queue of every such job is the refill's (the queue ids
    given are not read) and the jobs go in only if it is active (see :class:`QueueRefill`).
    Returns the jobs' ids in the order of ``rows``."""
    names = list(rows[0])
    params: dict[str, Any] = {}
    varying: list[str] = []
    for i, name in enumerate(names):
        values = [row[name] for row in rows]
        column_type = jobs_table.c[name].type
        if isinstance(column_type, TypeDecorator):
            values = [column_type.process_bind_param(v, _DIALECT) for v in values]
        if len(rows) > 1 and any(v != values[0] for v in values):
            params[f"a{i}"] = _json_array(values)
            varying.append(name)
        else:
            params[f"a{i}"] = values[0]
    places = list(queues) if queues is not None else [None] * len(rows)
    queue_shape = _shape([p[0] if p else None for p in places],
                         [p[1] if p else None for p in places], params)
    if refill is not None and queue_shape != "none":
        queue_shape = "refill-" + queue_shape
        del params["q_tq"]
        params.update(r_digest=refill.digest, r_count=refill.count, r_sum=refill.priority_sum)
    params["h_job"] = _json_array([place + 1 for place, _, _, _ in histories])
    params["h_status"] = _json_array([status for _, status, _, _ in histories])
    params["h_minor"] = _json_array([minor for _, _, minor, _ in histories])
    params["h_source"] = _json_array([source for _, _, _, source in histories])
    params["at"] = _UTC.process_bind_param(now, _DIALECT)
    params["n"] = len(rows)
    stmt = _statement(tuple(names), tuple(varying), queue_shape)
    result = conn.execute(stmt, params).all()
    if refill is not None and queue_shape != "none":
        refill.tq_id = result[0][1] if result else None
    return [row[0] for row in result]


def _shape(tq_ids: list[int | None], ranks: list[int | None], params: dict[str, Any]) -> str:
    """How the queue rows travel: "none" (no job waits in a queue), "same" (every job in the
    same queue with the same rank: two scalars) or "each" (two arrays)."""
    if all(t is None for t in tq_ids):
        return "none"
    if len(tq_ids) == 1 or (all(t == tq_ids[0] for t in tq_ids)
                            and all(r == ranks[0] for r in ranks)):
        params["q_tq"], params["q_rank"] = tq_ids[0], ranks[0]
        return "same"
    params["q_tq"], params["q_rank"] = _json_array(tq_ids), _json_array(ranks)
    return "each"


def _json_array(values: list[Any]) -> str:
    """``values`` as one JSON array, for ``json_array_elements_text`` (a datetime as ISO 8601
    text, which PostgreSQL's timestamp input reads)."""
    return json.dumps(values, ensure_ascii=False, separators=(",", ":"), default=_iso)


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} cannot be sent as a JSON array element")


def _type(column: Column[Any]) -> str:
    col_type = column.type
    if isinstance(col_type, TypeDecorator):
        col_type = col_type.impl_instance
    return str(col_type.compile(dialect=_DIALECT))


def _elements(param: str) -> str:
    """The text elements of the JSON array sent as ``param``, in order (null: SQL NULL)."""
    return f"json_array_elements_text(CAST(:{param} AS json))"


@functools.lru_cache(maxsize=64)
def _statement(names: tuple[str, ...], varying: tuple[str, ...], queues: str) -> TextClause:
    """The statement for one shape of rows, built once per process."""
    index = {name: i for i, name in enumerate(names)}
    # Each array's column in src is named as its parameter.
    arrays = [(f"a{index[n]}", _type(jobs_table.c[n])) for n in varying]
    if queues in ("refill-each", "each"):
        if queues == "each":
            arrays.append(("q_tq", _type(tq_jobs_table.c.tq_id)))
        arrays.append(("q_rank", _type(tq_jobs_table.c["rank"])))
    if arrays:
        typed = ", ".join(f"CAST(s.{name} AS {sql_type}) AS {name}" for name, sql_type in arrays)
        source = (f"SELECT {typed}, s.ord "
                  f"FROM ROWS FROM ({', '.join(_elements(name) for name, _ in arrays)}) "
                  f"WITH ORDINALITY AS s({', '.join(name for name, _ in arrays)}, ord)")
    else:
        source = "SELECT ord FROM generate_series(1, CAST(:n AS integer)) AS g(ord)"
    values = [f"src.a{index[n]}" if n in varying
              else f"CAST(:a{index[n]} AS {_type(jobs_table.c[n])})" for n in names]
    h = history_table.c
    sql = (
        f"WITH src AS ({source}), "
        f"ins AS (INSERT INTO {jobs_table.name} ({', '.join(names)}) "
        f"SELECT {', '.join(values)} FROM src ORDER BY src.ord RETURNING id), "
        "num AS (SELECT id, row_number() OVER (ORDER BY id) AS ord FROM ins), "
        f"hist AS (INSERT INTO {history_table.name} (job_id, at, status, minor_status, source) "
        f"SELECT num.id, CAST(:at AS {_type(h.at)}), h.status, h.minor, h.source "
        f"FROM ROWS FROM ({_elements('h_job')}, {_elements('h_status')}, "
        f"{_elements('h_minor')}, {_elements('h_source')}) WITH ORDINALITY "
        "AS h(job, status, minor, source, k) JOIN num ON num.ord = CAST(h.job AS bigint) "
        "ORDER BY h.k)"
    )
    if queues == "same":
        sql += (f", queued AS (INSERT INTO {tq_jobs_table.name} (job_id, tq_id, rank) "
                f"SELECT num.id, CAST(:q_tq AS {_type(tq_jobs_table.c.tq_id)}), "
                f"CAST(:q_rank AS {_type(tq_jobs_table.c['rank'])}) FROM num)")
    elif queues == "each":
        sql += (f", queued AS (INSERT INTO {tq_jobs_table.name} (job_id, tq_id, rank) "
                "SELECT num.id, src.q_tq, src.q_rank FROM src JOIN num ON num.ord = src.ord "
                "WHERE src.q_tq IS NOT NULL)")
    elif queues.startswith("refill-"):
        tq = task_queues_table.c
        sql += (f", q AS (UPDATE {task_queues_table.name} SET "
                "mean_job_priority = (mean_job_priority * jobs_inserted "
                f"+ CAST(:r_sum AS {_type(tq.mean_job_priority)})) "
                f"/ (jobs_inserted + CAST(:r_count AS {_type(tq.jobs_inserted)})), "
                f"jobs_inserted = jobs_inserted + CAST(:r_count AS {_type(tq.jobs_inserted)}), "
                f"emptied_at = NULL WHERE digest = CAST(:r_digest AS {_type(tq.digest)}) "
                "AND active = 1 RETURNING id)")
        rank = _type(tq_jobs_table.c["rank"])
        sql += (f", queued AS (INSERT INTO {tq_jobs_table.name} (job_id, tq_id, rank) "
                + (f"SELECT num.id, q.id, CAST(:q_rank AS {rank}) FROM num CROSS JOIN q)"
                   if queues == "refill-same" else
                   "SELECT num.id, q.id, src.q_rank FROM src JOIN num ON num.ord = src.ord "
                   "CROSS JOIN q WHERE src.q_rank IS NOT NULL)"))
        return text(sql + " SELECT num.id, (SELECT id FROM q) FROM num ORDER BY num.ord")
    return text(sql + " SELECT id FROM num ORDER BY ord")
