"""Task-queue benchmark: insertion into task queues, then match-and-claim rate and latency.

For each task-queue count Q, a fresh database (``gp_bench_*``, dropped at the end) or SQLite
file is built with the alembic schema. Jobs go in through the library path (add_jobs →
Received→Checking → enqueue_jobs, one transaction per ``--batch`` jobs), spread round-robin over
Q distinct task-queue definitions; that path is timed (the "insert" line). It stops after
``--insert-seconds`` (or ``--insert-jobs``), and the benchmark then bulk-loads the remaining jobs
itself, in the state the library leaves them (COPY on PostgreSQL; the "bulk_fill" line), so that
``--jobs`` jobs wait at every Q without hours of inserting. The fair share is recomputed once, as
the priority agent would, and the planner statistics refreshed (on PostgreSQL with VACUUM
ANALYZE, and the claim tables are vacuumed before each claim measurement: autovacuum may be off
on a test server; ``--no-vacuum`` skips this). Then 1 and 4 worker processes (spawned) claim with
``claim_jobs``, one claim per transaction, each transaction timed, for ``--claims`` claims or
``--claim-seconds``. The first line describes the server (version, durability settings).

One JSON line per measurement goes to stdout; progress goes to stderr. Commits stay durable:
the benchmark changes no synchronous_commit/fsync setting. Run from the repository root::

    .venv/bin/python bench/queue_ops.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test

Queue layout: queue ``q`` belongs to owner ``user<q>`` of group ``lhcb_user`` (VO ``lhcb``), so
every queue is a distinct definition; one queue in a hundred (``q % 100 == 0``) also carries the
tag ``Special``, which the "selective" resource requires (the "generic" one takes any tag). Job
``i`` goes to queue ``i % Q`` with user priority ``1 + i % 5``, so the first Q jobs create all
queues (the "create_phase" of the insert line).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import random
import shutil
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kit import (
    backend_of,
    emit,
    end_on_signals,
    fresh_database,
    int_list,
    log,
    percentile_ms,
    rate,
    start_together,
    url_option,
)
from sqlalchemy import (
    Table,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.schema import ColumnDefault

from taskqueue.core.definitions import JobRequirements, TaskQueueDefinition
from taskqueue.core.resources import Resource, parse_resource
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db.database import is_retryable, make_engine, make_session_factory
from taskqueue.db.models import (
    TaskQueue,
    TaskQueueJob,
    history_table,
    jobs_table,
    task_queues_table,
    tq_jobs_table,
    tq_tags_table,
)
from taskqueue.matching.claim import claim_jobs, matching_queues
from taskqueue.queues.jobs import NewJob, add_jobs, apply_transition
from taskqueue.queues.shares import recompute_priorities, virtual_time
from taskqueue.queues.taskqueues import INITIAL_PRIORITY, QueueEntry, enqueue_jobs

_HERE = Path(__file__).resolve().parent

VO = "lhcb"
GROUP = "lhcb_user"
SPECIAL_TAG = "Special"
#: One queue in SPECIAL_EVERY carries the tag the selective resource requires.
SPECIAL_EVERY = 100
#: Progress lines on stderr at most this often (seconds).
PROGRESS_EVERY = 15.0

GENERIC: dict[str, Any] = {"vo": VO, "tags": "ANY"}
SELECTIVE: dict[str, Any] = {"vo": VO, "required_tags": [SPECIAL_TAG], "tags": [SPECIAL_TAG]}
RESOURCES = {"generic": GENERIC, "selective": SELECTIVE}

# --------------------------------------------------------------------------- databases

# --------------------------------------------------------------------------- insertion


def requirements_for(q: int) -> JobRequirements:
    """The requirements of the jobs of queue ``q``: a distinct definition per ``q``."""
    tags = frozenset({SPECIAL_TAG}) if q % SPECIAL_EVERY == 0 else frozenset()
    return JobRequirements(vo=VO, owner=f"user{q}", owner_group=GROUP, cpu_time=86400,
                           processors=1, memory=2048, tags=tags)


def description_for(i: int, q: int) -> str:
    return (f'[Executable = "bench.sh"; Arguments = "{i}"; JobName = "bench-{i}"; '
            f'Owner = "user{q}"; OwnerGroup = "{GROUP}"; CPUTime = 86400; '
            f'InputSandbox = {{"bench.sh", "LFN:/lhcb/user/bench/input-{i % 997}.dat"}}; '
            f'OutputSandbox = {{"std.out", "std.err"}}]')


def insert_jobs(url: str, backend: str, queues: int, n_jobs: int, batch: int,
                settings: Settings, *, max_seconds: float, total_jobs: int) -> int:
    """Insert up to ``n_jobs`` jobs over ``queues`` queues through the library, stopping after
    the batch that crosses ``max_seconds``; print the insert measurement; return the count."""
    engine = make_engine(url)
    factory = make_session_factory(engine)
    rng = random.Random(queues)
    reqs = [requirements_for(q) for q in range(queues)]
    total = add_s = enqueue_s = commit_s = 0.0
    create_total = create_enqueue = 0.0
    create_jobs = 0
    create_batches: list[float] = []
    last_log = time.perf_counter()
    done = 0
    try:
        while done < n_jobs and (done == 0 or total < max_seconds):
            start = done
            size = min(batch, n_jobs - start)
            creating = start < queues
            jobs = []
            for i in range(start, start + size):
                q = i % queues
                jobs.append(NewJob(description_for(i, q), reqs[q], user_priority=priority_of(i)))
            now = datetime.now(UTC)
            t0 = time.perf_counter()
            with factory.begin() as session:
                ids = add_jobs(session, jobs, now=now)
                apply_transition(session, ids, JobStatus.RECEIVED, JobStatus.CHECKING,
                                 minor_status="Job sanity", source="bench", now=now)
                t1 = time.perf_counter()
                enqueue_jobs(session, [QueueEntry(jid, j.requirements, j.user_priority)
                                       for jid, j in zip(ids, jobs, strict=True)],
                             settings, now=now, rng=rng)
                t2 = time.perf_counter()
            t3 = time.perf_counter()
            total += t3 - t0
            add_s += t1 - t0
            enqueue_s += t2 - t1
            commit_s += t3 - t2
            if creating:
                create_total += t3 - t0
                create_enqueue += t2 - t1
                create_jobs += size
                create_batches.append(t3 - t0)
            done += size
            if t3 - last_log > PROGRESS_EVERY:
                last_log = t3
                log(f"  Q={queues}: inserted {done:,}/{n_jobs:,} jobs in {total:.0f} s "
                    f"({done / total:,.0f} jobs/s; last batch {t3 - t0:.2f} s, "
                    f"enqueue {t2 - t1:.2f} s)")
    finally:
        engine.dispose()
    created = min(queues, done)
    rest_jobs = done - create_jobs
    rest_total = total - create_total
    rest_enqueue = enqueue_s - create_enqueue
    emit({
        "measure": "insert", "backend": backend, "queues": queues, "jobs": done,
        "total_jobs": total_jobs, "batch": batch, "seconds": round(total, 2),
        "jobs_per_s": rate(done, total), "enqueue_seconds": round(enqueue_s, 2),
        "enqueue_jobs_per_s": rate(done, enqueue_s),
        "add_and_check_seconds": round(add_s, 2), "commit_seconds": round(commit_s, 2),
        # The batches that created queues (the first Q jobs) versus the others.
        "create_phase": {"jobs": create_jobs, "queues_created": created,
                         "seconds": round(create_total, 2),
                         "enqueue_seconds": round(create_enqueue, 2),
                         "enqueue_jobs_per_s": rate(create_jobs, create_enqueue),
                         "queues_per_s": rate(created, create_total),
                         "first_batch_s": _round(create_batches[0] if create_batches else None),
                         "last_batch_s": _round(create_batches[-1] if create_batches else None)},
        "fill_phase": {"jobs": rest_jobs, "seconds": round(rest_total, 2),
                       "enqueue_seconds": round(rest_enqueue, 2),
                       "jobs_per_s": rate(rest_jobs, rest_total),
                       "enqueue_jobs_per_s": rate(rest_jobs, rest_enqueue)},
    })
    return done


def priority_of(i: int) -> int:
    return 1 + i % 5


def bulk_fill(url: str, backend: str, queues: int, first: int, n_jobs: int,
              settings: Settings, *, chunk: int = 10_000) -> None:
    """Bring the database to ``n_jobs`` waiting jobs without the library's insert path.

    Jobs ``first`` .. ``n_jobs - 1`` are written by bulk INSERTs (COPY on PostgreSQL) in the
    state the library leaves them in (status Waiting, three history rows, a task_queue_jobs row),
    and queues the library did not get to are created the same way (their fair-share
    priorities are set afterwards by :func:`recompute`).
    """
    if first >= n_jobs:
        return
    engine = make_engine(url)
    factory = make_session_factory(engine)
    rng = random.Random(-queues)
    defs = [TaskQueueDefinition.for_job(requirements_for(q), settings) for q in range(queues)]
    t_start = time.perf_counter()
    queues_created = 0
    last_log = t_start
    try:
        with factory.begin() as session:
            existing = dict(session.execute(
                select(TaskQueue.digest, TaskQueue.id)).all())
        missing = [q for q in range(queues) if defs[q].digest() not in existing]
        for lo in range(0, len(missing), chunk):
            part = missing[lo:lo + chunk]
            now = datetime.now(UTC)
            with factory.begin() as session:
                conn = session.connection()
                vt = virtual_time(session, VO)
                rows = [_queue_row(defs[q], now, vt + rng.expovariate(INITIAL_PRIORITY),
                                   queues, n_jobs, q)
                        for q in part]
                ids = list(conn.execute(
                    insert(task_queues_table).returning(task_queues_table.c.id,
                                                        sort_by_parameter_order=True),
                    rows).scalars())
                tags = [{"tq_id": tq_id, "value": tag} for q, tq_id in zip(part, ids, strict=True)
                        for tag in sorted(defs[q].tags)]
                if tags:
                    conn.execute(insert(tq_tags_table), tags)
            existing.update({defs[q].digest(): tq_id for q, tq_id in zip(part, ids, strict=True)})
            queues_created += len(part)
        if missing:
            log(f"  Q={queues}: bulk-created {queues_created:,} queues in "
                f"{time.perf_counter() - t_start:.0f} s")
        tq_of = [existing[d.digest()] for d in defs]
        fill = _fill_jobs_copy if backend == "postgresql" else _fill_jobs_insert
        for lo in range(first, n_jobs, chunk):
            hi = min(lo + chunk, n_jobs)
            with factory.begin() as session:
                fill(session, range(lo, hi), queues, tq_of, datetime.now(UTC))
            if time.perf_counter() - last_log > PROGRESS_EVERY:
                last_log = time.perf_counter()
                log(f"  Q={queues}: bulk-filled {hi - first:,}/{n_jobs - first:,} jobs in "
                    f"{last_log - t_start:.0f} s")
        with factory.begin() as session:
            # Each queue keeps the count and mean user priority of its jobs: bring those of
            # the queues the library made up to date with the jobs added here.
            _refresh_queue_statistics(session)
    finally:
        engine.dispose()
    seconds = time.perf_counter() - t_start
    log(f"  Q={queues}: bulk fill done in {seconds:.0f} s")
    emit({"measure": "bulk_fill", "backend": backend, "queues": queues,
          "jobs": n_jobs - first, "queues_created": queues_created,
          "seconds": round(seconds, 2), "jobs_per_s": rate(n_jobs - first, seconds),
          "method": "COPY" if backend == "postgresql" else "INSERT",
          "note": "benchmark's own bulk load, not the library's insert path"})


def _fill_jobs_insert(session: Session, numbers: range, queues: int, tq_of: list[int],
                      now: datetime) -> None:
    """Jobs ``numbers`` with their history and queue rows, by multi-row INSERTs."""
    conn = session.connection()
    rows = [_job_row(i, i % queues, now) for i in numbers]
    ids = list(conn.execute(
        insert(jobs_table).returning(jobs_table.c.id, sort_by_parameter_order=True),
        rows).scalars())
    conn.execute(insert(history_table), [
        {"job_id": jid, "at": now, "status": status, "minor_status": minor, "source": source}
        for jid in ids for status, minor, source in HISTORY])
    conn.execute(insert(tq_jobs_table), [
        {"job_id": jid, "tq_id": tq_of[i % queues], "rank": -priority_of(i)}
        for i, jid in zip(numbers, ids, strict=True)])


def _fill_jobs_copy(session: Session, numbers: range, queues: int, tq_of: list[int],
                    now: datetime) -> None:
    """The same rows as :func:`_fill_jobs_insert`, by PostgreSQL COPY (several times faster).

    Job ids are taken from the jobs sequence in one step; the benchmark is the only writer.
    """
    conn = session.connection()
    n = len(numbers)
    last = conn.execute(text("SELECT setval(pg_get_serial_sequence('jobs', 'id'), "
                             "nextval(pg_get_serial_sequence('jobs', 'id')) + :n - 1)"),
                        {"n": n}).scalar_one()
    ids = range(last - n + 1, last + 1)
    naive_now = now.astimezone(UTC).replace(tzinfo=None)  # UTCDateTime stores naive UTC
    columns = ["id", *_job_row(0, 0, now)]
    raw: Any = conn.connection.driver_connection
    with raw.cursor() as cur:
        with cur.copy(f"COPY jobs ({', '.join(columns)}) FROM STDIN") as copy:
            for i, jid in zip(numbers, ids, strict=True):
                row = _job_row(i, i % queues, now)
                row["id"] = jid
                row["submitted_at"] = naive_now
                copy.write_row([row[c] for c in columns])
        copy_history(cur, ids, naive_now)
        with cur.copy("COPY task_queue_jobs (job_id, tq_id, rank) FROM STDIN") as copy:
            for i, jid in zip(numbers, ids, strict=True):
                copy.write_row((jid, tq_of[i % queues], -priority_of(i)))


#: The history a job has once the library put it in a task queue.
HISTORY = (
    (JobStatus.RECEIVED.value, "Job accepted", "submit"),
    (JobStatus.CHECKING.value, "Job sanity", "bench"),
    (JobStatus.WAITING.value, "Pilot Agent Submission", "optimizer"),
)


def _queue_row(d: TaskQueueDefinition, now: datetime, draw_key: float, queues: int,
               n_jobs: int, q: int) -> dict[str, Any]:
    # Queue q holds jobs q, q + Q, q + 2Q, ... (fixed up by _refresh_queue_statistics).
    numbers = range(q, n_jobs, queues)
    return with_defaults(task_queues_table, {
        "digest": d.digest(), "vo": d.vo, "owner_group": d.owner_group, "owner": d.owner,
        "cpu_time": d.cpu_time, "processors": d.processors, "memory": d.memory,
        "job_type": d.job_type, "submit_pool": d.submit_pool, "priority": INITIAL_PRIORITY,
        "mean_job_priority": sum(priority_of(i) for i in numbers) / max(len(numbers), 1),
        "jobs_inserted": len(numbers),
        "active": 1, "created_at": now, "emptied_at": None, "draw_key": draw_key})


def _refresh_queue_statistics(session: Session) -> None:
    """Set every queue's job count and mean user priority from the jobs it holds."""
    tqj = tq_jobs_table.c
    tq = task_queues_table.c
    held = select(func.count()).where(tqj.tq_id == tq.id).scalar_subquery()
    mean = select(func.avg(-tqj.rank)).where(tqj.tq_id == tq.id).scalar_subquery()
    session.connection().execute(
        update(task_queues_table).values(jobs_inserted=held,
                                         mean_job_priority=func.coalesce(mean, 1.0)))


def _job_row(i: int, q: int, now: datetime) -> dict[str, Any]:
    req = requirements_for(q)
    return with_defaults(jobs_table, {
        "vo": req.vo, "owner": req.owner, "owner_group": req.owner_group,
        "status": JobStatus.WAITING.value, "minor_status": "Pilot Agent Submission",
        "description": description_for(i, q), "job_type": req.job_type,
        "user_priority": priority_of(i), "cpu_time": req.cpu_time,
        "processors": req.processors, "memory": req.memory,
        "submit_pool": req.submit_pool, "submitted_at": now, "reschedule_count": 0})


def copy_history(cursor: Any, ids: Sequence[int], at: datetime,
                 history: Sequence[tuple[str, str, str]] = HISTORY) -> None:
    """The status history of bulk-loaded jobs, each ``history`` row at ``at``, by COPY
    (PostgreSQL: ``cursor`` is psycopg's)."""
    with cursor.copy("COPY job_status_history (job_id, at, status, minor_status, source) "
                     "FROM STDIN") as copy:
        for jid in ids:
            for status, minor, source in history:
                copy.write_row((jid, at, status, minor, source))


def with_defaults(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` plus the model's scalar Python-side defaults for the columns it leaves out (the
    schema grows; a bulk row must hold every NOT NULL column, for COPY too)."""
    for column in table.columns:
        default = column.default
        if column.name not in row and isinstance(default, ColumnDefault) and default.is_scalar:
            row[column.name] = default.arg
    return row


def recompute(url: str, backend: str, queues: int, settings: Settings) -> None:
    """Run the fair-share recomputation once, as the priority agent would after a submission
    wave (enqueue_jobs gives new queues their share but leaves their siblings' for later)."""
    engine = make_engine(url)
    try:
        t0 = time.perf_counter()
        with make_session_factory(engine).begin() as session:
            changed = recompute_priorities(session, settings, {(VO, GROUP)})
        seconds = time.perf_counter() - t0
    finally:
        engine.dispose()
    emit({"measure": "recompute_priorities", "backend": backend, "queues": queues,
          "seconds": round(seconds, 2), "changed": len(changed)})


def analyze(url: str, backend: str, *, vacuum: bool) -> None:
    """Refresh the planner statistics after the load, as autovacuum would in a running system;
    on PostgreSQL also VACUUM (the load leaves every row it moved between statuses dead).
    No statement timeout: at ten million jobs it takes minutes."""
    engine = make_engine(url, statement_timeout=0)
    try:
        with engine.connect() as conn:
            if backend == "postgresql":
                t0 = time.perf_counter()
                conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                    text("VACUUM ANALYZE" if vacuum else "ANALYZE"))
                log(f"  {'VACUUM ANALYZE' if vacuum else 'ANALYZE'} took "
                    f"{time.perf_counter() - t0:.0f} s")
            elif backend == "mariadb":
                for table in ("jobs", "job_status_history", "task_queues", "task_queue_jobs",
                              "tq_tags"):
                    conn.execute(text(f"ANALYZE TABLE {table}")).all()
            else:
                conn.execute(text("ANALYZE"))
            conn.commit()
    finally:
        engine.dispose()


#: The tables a claim scans and rewrites, vacuumed before each claim measurement (PostgreSQL).
_HOT_TABLES = ("task_queues", "task_queue_jobs")


def vacuum_hot_tables(url: str) -> None:
    """VACUUM the claim path's tables, so that one measurement does not inherit the previous
    one's dead rows; stands in for autovacuum, which may be off on the server."""
    engine = make_engine(url)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f"VACUUM {', '.join(_HOT_TABLES)}"))
    finally:
        engine.dispose()


def server_info(url: str, backend: str) -> dict[str, Any]:
    """The server's version and the settings that bear on the numbers (read, never changed)."""
    engine = make_engine(url)
    info: dict[str, Any] = {"measure": "server", "backend": backend}
    try:
        with engine.connect() as conn:
            if backend == "postgresql":
                info["version"] = conn.execute(text("SHOW server_version")).scalar_one()
                for name in ("synchronous_commit", "fsync", "autovacuum", "shared_buffers",
                             "max_wal_size"):
                    info[name] = conn.execute(text(f"SHOW {name}")).scalar_one()
            elif backend == "mariadb":
                info["version"] = conn.execute(text("SELECT VERSION()")).scalar_one()
                for name in ("innodb_flush_log_at_trx_commit", "innodb_buffer_pool_size",
                             "sync_binlog"):
                    info[name] = conn.execute(text(f"SELECT @@{name}")).scalar_one()
            else:
                info["version"] = conn.execute(text("SELECT sqlite_version()")).scalar_one()
                for name in ("journal_mode", "synchronous"):
                    info[name] = conn.execute(text(f"PRAGMA {name}")).scalar_one()
    finally:
        engine.dispose()
    info["cpus"] = os.cpu_count()
    return info


def database_state(url: str, resource: Resource) -> tuple[int, int, int]:
    """(waiting jobs, active queues, queues the resource matches)."""
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            waiting = session.scalar(select(func.count()).select_from(TaskQueueJob)) or 0
            active = session.scalar(
                select(func.count()).select_from(TaskQueue).where(TaskQueue.active == 1)) or 0
            matching = len(matching_queues(session, resource))
            return waiting, active, matching
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- claims


@dataclass
class WorkerResult:
    worker: int
    latencies: list[float]
    jobs: int
    #: Latencies of the transactions that found no job (the measurement's end).
    empty: list[float]
    retries: int
    error: str | None = None


def claim_worker(worker: int, url: str, resource_data: dict[str, Any], count: int,
                 remaining: Any, stop: Any, barrier: Any, results: Any) -> None:
    """One worker process: claim until the shared budget is spent or no job is left."""
    latencies: list[float] = []
    empty: list[float] = []
    jobs = retries = 0
    error: str | None = None
    try:
        engine = make_engine(url, pool_size=1)
        factory = make_session_factory(engine)
        resource = parse_resource({**resource_data,
                                   "pilot_reference": f"bench-{os.getpid()}"})
        rng = random.Random(os.getpid())
        with engine.connect() as conn:  # open the pooled connection before the clock starts
            conn.execute(text("SELECT 1"))
        barrier.wait()
        while not stop.value:
            with remaining.get_lock():
                if remaining.value <= 0:
                    break
                remaining.value -= 1
            t0 = time.perf_counter()
            try:
                with factory.begin() as session:
                    claims = claim_jobs(session, resource, now=datetime.now(UTC), count=count,
                                        rng=rng)
            except DBAPIError as exc:
                if not is_retryable(exc) or retries >= 1000:
                    raise
                retries += 1
                with remaining.get_lock():
                    remaining.value += 1
                continue
            if not claims:
                # Nothing left that this resource can run: the measurement is over.
                empty.append(time.perf_counter() - t0)
                stop.value = 1
                break
            latencies.append(time.perf_counter() - t0)
            jobs += len(claims)
        engine.dispose()
    except BaseException:  # report, so that the parent does not wait for ever
        error = traceback.format_exc()
        stop.value = 1
    results.put(WorkerResult(worker, latencies, jobs, empty, retries, error))


def measure_claims(url: str, backend: str, queues: int, resource_name: str, processes: int,
                   claims: int, count: int, max_seconds: float) -> dict[str, Any]:
    """Run ``processes`` claimers for ``claims`` transactions in total, or until
    ``max_seconds`` have passed; return the record."""
    resource_data = RESOURCES[resource_name]
    waiting, active, matching = database_state(url, parse_resource(resource_data))
    ctx = mp.get_context("spawn")
    remaining = ctx.Value("l", claims)
    stop = ctx.Value("i", 0)
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    workers = [ctx.Process(target=claim_worker,
                           args=(w, url, resource_data, count, remaining, stop, barrier,
                                 results))
               for w in range(processes)]
    start_together(workers, barrier, timeout=120, what="claim workers")
    t0 = time.perf_counter()
    outcome: list[WorkerResult] = []
    time_limited = False
    while len(outcome) < len(workers):
        try:
            outcome.append(results.get(timeout=max(t0 + max_seconds - time.perf_counter(),
                                                   0.01)))
        except queue.Empty:
            # Out of time: the workers finish the transaction they are in and report.
            time_limited = True
            stop.value = 1
            outcome.append(results.get())
    seconds = time.perf_counter() - t0
    for p in workers:
        p.join()
    errors = [r.error for r in outcome if r.error]
    for err in errors:
        log(f"worker error:\n{err}")
    latencies = sorted(x for r in outcome for x in r.latencies)
    # A transaction that found nothing is not a claim: it is reported apart.
    done = len(latencies)
    empty = sorted(x for r in outcome for x in r.empty)
    jobs = sum(r.jobs for r in outcome)
    record: dict[str, Any] = {
        "measure": "claim", "backend": backend, "queues": queues, "resource": resource_name,
        "matching_queues": matching, "active_queues": active, "waiting_jobs": waiting,
        "processes": processes, "count": count, "claims": done, "jobs": jobs,
        "seconds": round(seconds, 3), "claims_per_s": rate(done, seconds),
        "jobs_per_s": rate(jobs, seconds),
        "p50_ms": percentile_ms(latencies, 0.50), "p99_ms": percentile_ms(latencies, 0.99),
        "max_ms": round(latencies[-1] * 1000, 2) if latencies else None,
        "retries": sum(r.retries for r in outcome),
    }
    if done < claims:
        record["requested_claims"] = claims
        record["ran_out_of_jobs"] = bool(empty)
        record["time_limited"] = time_limited
    if empty:
        record["empty_claims"] = len(empty)
        record["empty_claim_max_ms"] = round(empty[-1] * 1000, 2)
    if errors:
        record["worker_errors"] = len(errors)
    return record

def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)

# --------------------------------------------------------------------------- main

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    url_option(parser, None)
    parser.add_argument("--jobs", type=int, default=None,
                        help="waiting jobs per queue count (default 1,000,000 on PostgreSQL, "
                             "100,000 otherwise)")
    parser.add_argument("--queues", type=int_list, default=[10, 1000, 100000],
                        help="comma list of task-queue counts (default 10,1000,100000)")
    parser.add_argument("--processes", type=int_list, default=[1, 4],
                        help="comma list of claiming process counts (default 1,4)")
    parser.add_argument("--claims", type=int, default=5000,
                        help="claim transactions per measurement (default 5000)")
    parser.add_argument("--claim-seconds", type=float, default=60.0,
                        help="stop a claim measurement after this many seconds even if fewer "
                             "than --claims claims were done (default 60)")
    parser.add_argument("--batch", type=int, default=1000,
                        help="jobs per insert transaction (default 1000)")
    parser.add_argument("--multi-count", type=int, default=4,
                        help="jobs per claim in the multi-job measurement (default 4)")
    parser.add_argument("--insert-jobs", type=int, default=None,
                        help="at most this many jobs go through the library's insert path "
                             "(default: all); the rest are bulk-filled")
    parser.add_argument("--insert-seconds", type=float, default=200.0,
                        help="stop the library insert path after the batch that crosses this "
                             "many seconds (default 200, 0 = no limit) and bulk-fill the rest")
    parser.add_argument("--no-vacuum", action="store_true",
                        help="PostgreSQL: only ANALYZE after the load, and do not VACUUM the "
                             "claim tables before each claim measurement")
    parser.add_argument("--keep", action="store_true", help="do not drop the databases")
    args = parser.parse_args(argv)
    if (args.claims < 1 or args.batch < 1 or args.multi_count < 1
            or args.claim_seconds <= 0):
        parser.error("--claims, --claim-seconds, --batch and --multi-count must be positive")
    if args.jobs is not None and args.jobs < 1:
        parser.error("--jobs must be positive")
    if args.insert_jobs is not None and args.insert_jobs < 1:
        parser.error("--insert-jobs must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    end_on_signals()
    tmpdir = Path(tempfile.mkdtemp(prefix="gp_bench_"))
    base_url = args.url or f"sqlite:///{tmpdir / 'bench.db'}"
    backend = backend_of(base_url)
    n_jobs = args.jobs or (1_000_000 if backend == "postgresql" else 100_000)
    settings = Settings()
    started = time.perf_counter()
    log(f"backend {backend}, {n_jobs:,} jobs, queues {args.queues}, processes "
        f"{args.processes}, {args.claims} claims per measurement")
    # (resource, jobs per claim) in the order run; each with every process count.
    # The selective run goes first: the generic resource also drains the Special queues.
    plan = [("selective", 1), ("generic", 1), ("generic", args.multi_count)]
    server_printed = False
    try:
        for queues in args.queues:
            if queues > n_jobs:
                log(f"skipping Q={queues}: more queues than jobs ({n_jobs})")
                continue
            with fresh_database(base_url, prefix=f"gp_bench_q{queues}", keep=args.keep,
                                tmpdir=tmpdir) as db:
                if not server_printed:
                    emit(server_info(db.url, backend))
                    server_printed = True
                log(f"Q={queues}: inserting {n_jobs:,} jobs into {db.label}")
                limit = min(args.insert_jobs or n_jobs, n_jobs)
                inserted = insert_jobs(db.url, backend, queues, limit, args.batch, settings,
                                       max_seconds=args.insert_seconds or float("inf"),
                                       total_jobs=n_jobs)
                if inserted < n_jobs:
                    log(f"Q={queues}: bulk-filling jobs {inserted:,}..{n_jobs - 1:,}")
                    bulk_fill(db.url, backend, queues, inserted, n_jobs, settings)
                recompute(db.url, backend, queues, settings)
                analyze(db.url, backend, vacuum=not args.no_vacuum)
                for resource_name, count in plan:
                    for processes in args.processes:
                        log(f"Q={queues}: claims, {resource_name} resource, count={count}, "
                            f"{processes} process(es)")
                        if backend == "postgresql" and not args.no_vacuum:
                            vacuum_hot_tables(db.url)
                        emit(measure_claims(db.url, backend, queues, resource_name, processes,
                                            args.claims, count, args.claim_seconds))
            log(f"elapsed so far {time.perf_counter() - started:.0f} s")
    finally:
        if not args.keep:
            shutil.rmtree(tmpdir, ignore_errors=True)
    log(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
