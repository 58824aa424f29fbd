"""Creating jobs and changing their status: the only code that writes ``jobs.status``.

Every status change goes through :func:`apply_transition`, which checks the state machine's
table, guards the UPDATE with the status the caller expects (so a concurrent change is detected,
not overwritten) and appends one history row per job.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    CTE,
    BigInteger,
    ClauseElement,
    ColumnElement,
    Executable,
    any_,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from taskqueue.core.definitions import JobRequirements
from taskqueue.core.errors import ConflictError, IllegalTransitionError, NotFoundError
from taskqueue.core.states import JobStatus, is_allowed
from taskqueue.db.bulk import in_ids, insert_rows, insert_rows_returning_ids
from taskqueue.db.models import (
    Job,
    JobStatusHistory,
    UTCDateTime,
    history_table,
    job_payloads_table,
    jobs_table,
    tq_jobs_table,
)
from taskqueue.queues.newjobs import QueueRefill, insert_new_jobs


@dataclass(frozen=True)
class NewJob:
    """A job as it arrives: its exact description text and what scheduling needs of it."""

    description: str
    requirements: JobRequirements
    user_priority: int = 1
    description_format: str = "jdl"
    bulk_index: int | None = None
    job_name: str | None = None
    job_group: str | None = None


@dataclass(frozen=True)
class Passage:
    """A status a new job went through before it was stored (see :func:`add_jobs`)."""

    status: JobStatus
    minor_status: str
    source: str


def add_jobs(session: Session, jobs: Sequence[NewJob], *, now: datetime,
             source: str = "submit",
             outcomes: Sequence[Sequence[Passage]] | None = None,
             queues: Sequence[tuple[int, int] | None] | None = None,
             refill: QueueRefill | None = None) -> list[int]:
    """Store new jobs with status Received; return their ids in the order given.

    ``outcomes`` (one per job): the statuses each job went through after Received before it is
    stored, decided in memory (the optimizer chain at submission); the job is stored in the
    last of them, and its whole history, Received first, goes in with one statement.
    ``queues`` (one per job): the (task queue, rank) of its ``task_queue_jobs`` row, or None
    for a job that waits in none; the queues must be locked already
    (:func:`taskqueue.queues.taskqueues.reserve_queues`). On PostgreSQL the jobs, their history
    and their queue rows go in with one statement (:mod:`taskqueue.queues.newjobs`), which with
    ``refill`` (PostgreSQL only) also folds the jobs into their one queue's statistics."""
    if not jobs:
        return []
    # The jobs of a bulk share a few outcome lists: each distinct one is read once.
    distinct = {id(p): p for p in outcomes}.values() if outcomes is not None else ()
    moves = {(before, after) for passages in distinct
             for before, after in zip([JobStatus.RECEIVED, *(p.status for p in passages)],
                                      [p.status for p in passages], strict=False)}
    for before, after in sorted(moves):
        if not is_allowed(before, after):
            raise IllegalTransitionError(f"a job cannot go from {before} to {after}")
    received = JobStatus.RECEIVED.value
    rows = [
        {
            "vo": j.requirements.vo,
            "owner": j.requirements.owner,
            "owner_group": j.requirements.owner_group,
            "status": received,
            "minor_status": "Job accepted",
            "description": j.description,
            "description_format": j.description_format,
            "bulk_index": j.bulk_index,
            "job_type": j.requirements.job_type,
            "user_priority": j.user_priority,
            "cpu_time": j.requirements.cpu_time,
            "processors": j.requirements.processors,
            "memory": j.requirements.memory,
            "submit_pool": j.requirements.submit_pool,
            "submitted_at": now,
            "reschedule_count": 0,
            "job_name": j.job_name,
            "job_group": j.job_group,
        }
        for j in jobs
    ]
    if outcomes is not None:
        last: dict[int, tuple[str, str, datetime | None]] = {
            id(p): (p[-1].status.value, p[-1].minor_status,
                    now if p[-1].status == JobStatus.FAILED else None)
            for p in distinct if p}
        for row, passages in zip(rows, outcomes, strict=True):
            row["ended_at"] = None
            if passages:
                row["status"], row["minor_status"], row["ended_at"] = last[id(passages)]
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        return insert_new_jobs(conn, rows, now=now, histories=_histories(
            len(rows), outcomes, source), queues=queues, refill=refill)
    if refill is not None:
        raise ValueError("a queue refill with the jobs is for PostgreSQL only")
    ids = insert_rows_returning_ids(conn, jobs_table, rows)
    history = [{"job_id": ids[i], "at": now, "status": status, "minor_status": minor,
                "source": by} for i, status, minor, by in _histories(len(ids), outcomes, source)]
    insert_rows(conn, history_table, history)
    if queues is not None:
        insert_rows(conn, tq_jobs_table, [
            {"job_id": jid, "tq_id": place[0], "rank": place[1]}
            for jid, place in zip(ids, queues, strict=True) if place is not None])
    return ids


def name_jobs(session: Session, names: Sequence[tuple[int, str]]) -> None:
    """Give stored jobs their names: ``(job id, name)`` (a name that holds the job's id is
    known only once the job is stored: DIRAC's ``%j``)."""
    if names:
        table = jobs_table
        session.execute(update(table).where(table.c.id == bindparam("jid"))
                        .values(job_name=bindparam("name")),
                        [{"jid": job_id, "name": name} for job_id, name in names])


def _histories(count: int, outcomes: Sequence[Sequence[Passage]] | None, source: str
               ) -> list[tuple[int, str, str, str]]:
    """The history rows of ``count`` new jobs as (job's place, status, minor status, source),
    in the order they are to get their ids: every job's Received, then each later passage
    row by row in status order, so that each job's history reads in order by id."""
    received = JobStatus.RECEIVED.value
    out = [(i, received, "Job accepted", source) for i in range(count)]
    if outcomes is not None:
        depth = max((len(p) for p in outcomes), default=0)
        for k in range(depth):
            shown: dict[int, tuple[str, str, str]] = {}  # per distinct outcome list
            for i, passages in enumerate(outcomes):
                if k < len(passages):
                    row = shown.get(id(passages))
                    if row is None:
                        p = passages[k]
                        row = shown[id(passages)] = (p.status.value, p.minor_status, p.source)
                    out.append((i, *row))
    return out


def apply_transition(session: Session, job_ids: Sequence[int], current: JobStatus,
                     new: JobStatus, *, minor_status: str, source: str, now: datetime,
                     values: dict[str, Any] | None = None) -> None:
    """Move jobs known to be in ``current`` to ``new``, or raise and change nothing.

    ``values`` sets further columns in the same UPDATE (pilot, site, times). Raises
    :class:`IllegalTransitionError` when the table forbids the move and
    :class:`ConflictError` when some job is no longer in ``current``.
    """
    if not job_ids:
        return
    if not is_allowed(current, new):
        raise IllegalTransitionError(
            f"a job cannot go from {current} to {new}"
            + _job_list_suffix(job_ids)
        )
    dialect = session.get_bind().dialect.name
    values = values or {}
    params = {"p_ids": list(job_ids), **transition_parameters(
        current, new, minor_status=minor_status, source=source, now=now, values=values)}
    if any(isinstance(v, ClauseElement) for v in values.values()):
        # An SQL expression (e.g. a counter + 1) cannot be a parameter: built for this call.
        stmt = _move_statement.__wrapped__(dialect, (), tuple(sorted(values.items(), key=str)))
    else:
        stmt = _move_statement(dialect, tuple(sorted(values)), ())
    if len(job_ids) == 1:  # one row: it changes or it does not, nothing partial to undo
        changed = _move(session, stmt, job_ids, params)
    else:
        # All or nothing, even for a caller that catches the error and commits.
        savepoint = session.begin_nested()
        changed = _move(session, stmt, job_ids, params)
        if changed == len(job_ids):
            savepoint.commit()
        else:
            savepoint.rollback()
    if changed != len(job_ids):
        raise ConflictError(
            f"{len(job_ids) - changed} of {len(job_ids)} jobs were no longer {current} when "
            f"moving them to {new}{_job_list_suffix(job_ids)}"
        )


@functools.lru_cache(maxsize=64)
def _move_statement(dialect: str, value_keys: tuple[str, ...],
                    literal_values: tuple[tuple[str, Any], ...]) -> Executable:
    """The guarded status UPDATE (and, on PostgreSQL, the history INSERT fed by its RETURNING,
    one statement and one round trip), built once per dialect and set of columns."""
    jobs = jobs_table.c
    if dialect == "postgresql":
        moved, recorded = status_change_ctes(
            jobs.id == any_(bindparam("p_ids", type_=ARRAY(BigInteger()))), value_keys,
            literal_values)
        return select(recorded.c.job_id).add_cte(moved)
    return (
        update(jobs_table)
        .where(jobs.id.in_(bindparam("p_ids", expanding=True)),
               jobs.status == bindparam("p_current"))
        .values(**_set_clause(value_keys, literal_values))
    )


def _set_clause(value_keys: tuple[str, ...], literal_values: tuple[tuple[str, Any], ...]
                ) -> dict[str, Any]:
    jobs = jobs_table.c
    return {"status": bindparam("p_new"), "minor_status": bindparam("p_minor"),
            **{key: bindparam(f"v_{key}", type_=jobs[key].type) for key in value_keys},
            **dict(literal_values)}


def status_change_ctes(which: ColumnElement[bool], value_keys: tuple[str, ...],
                       literal_values: tuple[tuple[str, Any], ...] = ()) -> tuple[CTE, CTE]:
    """PostgreSQL: the status change of the jobs ``which`` selects as two CTEs, the guarded
    UPDATE ("moved") and the history INSERT from its RETURNING ("recorded"), for statements
    that do more in the same round trip (a claim). Parameters: :func:`transition_parameters`.
    """
    moved = (
        update(jobs_table).where(which, jobs_table.c.status == bindparam("p_current"))
        .values(**_set_clause(value_keys, literal_values))
        .returning(jobs_table.c.id).cte("moved")
    )
    recorded = insert(history_table).from_select(
        ["job_id", "at", "status", "minor_status", "source"],
        select(moved.c.id, bindparam("p_at", type_=UTCDateTime()), bindparam("p_new"),
               bindparam("p_minor"), bindparam("p_source")),
    ).returning(history_table.c.job_id).cte("recorded")
    return moved, recorded


def transition_parameters(current: JobStatus, new: JobStatus, *, minor_status: str,
                          source: str, now: datetime, values: dict[str, Any] | None = None
                          ) -> dict[str, Any]:
    """The parameters of a status change's statements; refuses a move the table forbids."""
    if not is_allowed(current, new):
        raise IllegalTransitionError(f"a job cannot go from {current} to {new}")
    return {"p_current": current.value, "p_new": new.value, "p_minor": minor_status,
            "p_source": source, "p_at": now,
            **{f"v_{key}": value for key, value in (values or {}).items()}}


def _move(session: Session, stmt: Executable, job_ids: Sequence[int],
          params: dict[str, Any]) -> int:
    """Run the guarded status change and append the history rows; return the jobs moved
    (elsewhere than on PostgreSQL the history is a second statement, run only when every job
    moved)."""
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        return len(conn.execute(stmt, params).all())
    changed: int = conn.execute(stmt, params).rowcount
    if changed == len(job_ids):
        _append_history(session, job_ids, JobStatus(params["p_new"]), params["p_minor"],
                        params["p_source"], params["p_at"])
    return changed


def set_job_status(session: Session, job_id: int, new: JobStatus, *, minor_status: str,
                   source: str, now: datetime, values: dict[str, Any] | None = None) -> JobStatus:
    """Move one job to ``new`` from whatever status it is in; return its previous status."""
    row = session.execute(
        select(Job.status).where(Job.id == job_id).with_for_update()
    ).scalar_one_or_none()
    if row is None:
        raise NotFoundError(f"job {job_id} does not exist")
    current = JobStatus(row)
    if not is_allowed(current, new):
        raise IllegalTransitionError(f"job {job_id} is {current} and cannot go to {new}")
    apply_transition(session, [job_id], current, new, minor_status=minor_status, source=source,
                     now=now, values=values)
    return current


def job_history(session: Session, job_id: int) -> list[JobStatusHistory]:
    return list(session.scalars(
        select(JobStatusHistory).where(JobStatusHistory.job_id == job_id)
        .order_by(JobStatusHistory.id)
    ))


def record_minor_status(session: Session, job_ids: Sequence[int], status: JobStatus,
                        minor_status: str, *, source: str, now: datetime) -> None:
    """A history row for a new minor status of each job (one INSERT for all) whose status
    stays ``status`` (the caller has set the jobs' own column)."""
    _append_history(session, job_ids, status, minor_status, source, now)


def _append_history(session: Session, job_ids: Iterable[int], status: JobStatus,
                    minor_status: str, source: str, now: datetime) -> None:
    insert_rows(session.connection(), history_table, [
        {"job_id": jid, "at": now, "status": status.value, "minor_status": minor_status,
         "source": source}
        for jid in job_ids
    ])


def _job_list_suffix(job_ids: Sequence[int]) -> str:
    shown = ", ".join(str(j) for j in list(job_ids)[:5])
    more = f" and {len(job_ids) - 5} more" if len(job_ids) > 5 else ""
    return f" (job {shown}{more})" if len(job_ids) == 1 else f" (jobs {shown}{more})"


def lock_received_jobs(session: Session, limit: int,
                       job_ids: Sequence[int] | None = None) -> list[Any]:
    """Up to ``limit`` Received jobs (of ``job_ids``, if given), oldest first, locked for this
    transaction; jobs another transaction holds are skipped, so several optimizers can work
    side by side."""
    stmt = (select(Job.id, Job.vo, Job.owner, Job.owner_group, Job.description,
                   Job.description_format, Job.bulk_index)
            .where(Job.status == JobStatus.RECEIVED.value))
    if job_ids is not None:
        stmt = stmt.where(Job.id.in_(list(job_ids)))
    return list(session.execute(
        stmt.order_by(Job.id).limit(limit).with_for_update(skip_locked=True)).all())


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a listing shows: a VO's, narrowed by any of the other fields.

    ``job_name`` and ``job_group`` match exactly, or by prefix when they end in ``*``;
    ``since`` keeps the jobs submitted at or after that time.
    """

    vo: str
    status: str | None = None
    site: str | None = None
    owner: str | None = None
    owner_group: str | None = None
    job_type: str | None = None
    job_name: str | None = None
    job_group: str | None = None
    since: datetime | None = None

    def where(self) -> list[ColumnElement[bool]]:
        """The conditions, for a SELECT on jobs."""
        conditions: list[ColumnElement[bool]] = [Job.vo == self.vo]
        for column, value in ((Job.status, self.status), (Job.site, self.site),
                              (Job.owner, self.owner), (Job.owner_group, self.owner_group),
                              (Job.job_type, self.job_type)):
            if value is not None:
                conditions.append(column == value)
        for column, value in ((Job.job_name, self.job_name), (Job.job_group, self.job_group)):
            if value is not None:
                conditions.append(_name_matches(column, value))
        if self.since is not None:
            # The id bound lets a page scan start at the first job of the period (read from
            # the submitted_at index) instead of filtering every older job of the owner. The
            # "+ 0" keeps PostgreSQL from finding the minimum by walking the primary key from
            # its oldest job up.
            first = (select(func.min(Job.id + 0)).where(Job.submitted_at >= self.since)
                     .scalar_subquery())
            conditions += [Job.submitted_at >= self.since, Job.id >= first]
        return conditions


def _name_matches(column: Any, value: str) -> ColumnElement[bool]:
    if not value.endswith("*"):
        return cast(ColumnElement[bool], column == value)
    prefix = value[:-1]
    # "!" as the escape character: a backslash means something else in MariaDB's literals.
    escaped = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return cast(ColumnElement[bool], column.like(escaped + "%", escape="!"))


def find_jobs(session: Session, which: JobFilter, *, after: int = 0, limit: int = 100,
              before: int | None = None) -> list[Job]:
    """A page of the jobs ``which`` selects: by ascending id, those after ``after``; or, when
    ``before`` is given, newest first, those with an id below it."""
    stmt = select(Job).where(*which.where())
    if before is not None:
        return list(session.scalars(stmt.where(Job.id < before).order_by(Job.id.desc())
                                    .limit(limit)))
    return list(session.scalars(stmt.where(Job.id > after).order_by(Job.id).limit(limit)))


def count_jobs_by_status(session: Session, which: JobFilter) -> dict[str, int]:
    """How many of the jobs ``which`` selects are in each status (statuses with none left
    out)."""
    rows = session.execute(select(Job.status, func.count()).where(*which.where())
                           .group_by(Job.status))
    return {status: int(n) for status, n in rows}


def jobs_by_id(session: Session, job_ids: Sequence[int]) -> list[Job]:
    """The jobs of ``job_ids`` that exist, by ascending id."""
    if not job_ids:
        return []
    return list(session.scalars(select(Job).where(Job.id.in_(list(job_ids)))
                                .order_by(Job.id)))


_FOR_PILOT = select(jobs_table.c.id, jobs_table.c.vo, jobs_table.c.owner,
                    jobs_table.c.owner_group, jobs_table.c.job_type, jobs_table.c.description,
                    jobs_table.c.description_format, jobs_table.c.bulk_index,
                    job_payloads_table.c.payload).select_from(
    jobs_table.outerjoin(job_payloads_table, job_payloads_table.c.job_id == jobs_table.c.id))


def store_payloads(session: Session, payloads: Sequence[tuple[int, str]], *,
                   new: bool = False) -> None:
    """Store what a pilot is handed of each job's description: ``(job id, JSON)``, written
    once, when the description is read at submission (``new``: jobs just stored, so without
    a row) or optimization (a job that has its row already, one rescheduled, keeps it: the
    same text reads the same)."""
    if not payloads:
        return
    conn = session.connection()
    have: set[int] = set()
    if not new:
        have = set(conn.execute(select(job_payloads_table.c.job_id).where(in_ids(
            job_payloads_table.c.job_id, [i for i, _ in payloads], conn.dialect.name)))
            .scalars())
    insert_rows(conn, job_payloads_table, [{"job_id": i, "payload": p}
                                           for i, p in payloads if i not in have])


def jobs_for_pilot(session: Session, job_ids: Sequence[int]) -> list[Any]:
    """What a pilot is handed for each job (its identity, its description and its stored
    payload, None for a job stored without one), by id; only the columns needed, for the
    match path."""
    if not job_ids:
        return []
    conn = session.connection()
    if len(job_ids) == 1:
        return list(conn.execute(_FOR_PILOT_ONE, {"id": job_ids[0]}).all())
    rows = conn.execute(_FOR_PILOT.where(
        in_ids(jobs_table.c.id, job_ids, conn.dialect.name))).all()
    return sorted(rows, key=lambda r: r.id)


_FOR_PILOT_ONE = _FOR_PILOT.where(jobs_table.c.id == bindparam("id"))
