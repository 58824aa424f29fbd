"""Pilot-stream benchmark: a demand-driven stream of pilots claiming jobs, as on a real grid.

The workload. ``--jobs`` waiting jobs (at least one per queue, so ``max(--jobs, K)``) of the
VO ``benchvo`` over K task queues, for each K of ``--k``. Queue ``q`` is one combination of
owner x CPU time x site x platform x tags: CPU time ``CPU_TIMES[q % 4]``, site
``SITE_CHOICES[q % 5]`` (one of four sites, or none), platform ``PLATFORMS[q % 3]`` (two, or
none), tags ``TAG_SETS[q % 7]`` and owner ``user<q % 11 + 11 * (q // 4620)>``, which makes every
queue a distinct definition (the moduli are coprime). Job ``i < K`` goes to queue ``i``, the
others to a queue drawn with Zipf-like weights (a few big queues, many small ones); user
priorities 1..5. Everything is drawn from ``--seed``.

The pilots. Pilots arrive one at a time (per claimer): each is built from a waiting job drawn
uniformly among the jobs still waiting (so queues are chosen in proportion to their waiting
jobs) and is compatible with that job's queue, and usually with others too: the queue's site
(or a random one), its platform (or a random one), a CPU time at or above the queue's, the
queue's tags plus random others, and, for GPU queues, half the time GPU as a required tag.

The claim. In process, each pilot goes through the function the matcher's match endpoint runs,
``taskqueue.pilots.pilotmatch.match_for_pilot`` with the ClassAd expression check, as
``matcher/pilots.py`` does: on PostgreSQL and MariaDB one autocommit call of the database's
``gridpilot_claim``, elsewhere (and for what the call hands back) ``taskqueue.matching.limits.
claim_for_pilot`` and ``jobs_for_pilot`` in one transaction retried on a lost race
(``--path python``: the same without the database function, as on SQLite; ``--path claim_jobs``:
``taskqueue.matching.claim.claim_jobs`` alone; ``--path claim_function``: the database's claim
function alone, one autocommit call, without the pilot's record looked up first).
``--processes`` claimer processes share the stream. Over HTTP (``--http``), the same pilots POST
/api/v1/pilots/match to ``gridpilot serve`` (gunicorn, ``--workers``) from ``--clients``
client processes, with ``--counts`` jobs per request.

The checks. Every job handed out is checked against the pilot's resource by the benchmark's
own rules (a "violation" is a job the resource does not match, or a job of another VO), and
against the jobs handed out before (a "duplicate"). An empty answer while a job the pilot could
run was waiting is a "miss" (with several claimers, only when more such jobs wait than the
other claimers could hold at that instant). At the end, the jobs Matched in the database must
be exactly those handed out.

The numbers. One JSON line per measurement: claims/s and jobs/s, p50/p99 latency of a claim
(the transaction, or the HTTP request), misses, duplicates, violations, client CPU per claim
(the claimers' own CPU time inside the timed claims), database server CPU per claim from /proc
(PostgreSQL: the benchmark's own backends, and all postgres processes; MariaDB: the mariadbd
process, which also serves anyone else on the server), SQL statements and commits per claim
(a SQLAlchemy event counter, in process), and the machine's load in the window (/proc/stat:
busy cores, and the cores used by neither the benchmark nor the database; /proc/loadavg).

The yardsticks. Before each K, bench/calibration.py measures on the same database a ``SELECT 1``
loop and a single-row ``UPDATE … RETURNING`` with a durable commit per call (the floor of any
durable claim), with the client's and the server's CPU per call; it prints them (``"measure":
"calibration"``), and every measurement carries ``ratios``: its rates as multiples of the
floor's, its p99 as a multiple of the floor's, its server and client CPU per claim as multiples
of the calibration UPDATE's. Machines differ; the ratios are what to compare.

The database. ``--url`` names a database the benchmark may write to (default: an SQLite file in
a temporary folder); the schema is brought up to date, and only the benchmark's own VOs
(``benchvo``, ``benchbg*``) are deleted and loaded, by bulk INSERT (COPY on PostgreSQL), the
way bench/queue_ops.py loads. ``--background-jobs N`` adds N waiting jobs in four other VOs
over ``--background-queues`` queues (kept between runs when already there). Before each
measurement the workload is loaded afresh. Run from the repository root::

    .venv/bin/python bench/pilot_stream.py --url postgresql+psycopg://postgres@127.0.0.1:5432/x

Small and quick::

    .venv/bin/python bench/pilot_stream.py --jobs 2000 --k 10,100
"""

from __future__ import annotations

import argparse
import bisect
import functools
import http.client
import itertools
import json
import multiprocessing as mp
import os
import random
import re
import secrets
import shutil
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import calibration as cal
import matcher_http
import queue_ops
from kit import (
    backend_of,
    emit,
    end_on_signals,
    int_list,
    log,
    machine_cpu_seconds,
    percentile_ms,
    proc_cpu,
    rate,
    start_together,
    store_missing_payloads,
    tree_cpu_seconds,
    upgrade_schema,
)

_HERE = Path(__file__).resolve().parent

ROOT = _HERE.parent
VO = "benchvo"
BACKGROUND_VOS = ("benchbg0", "benchbg1", "benchbg2", "benchbg3")
GROUP = "benchvo_user"
SITES = ("LCG.CERN.cern", "LCG.CNAF.it", "LCG.RAL.uk", "LCG.IN2P3.fr")
SITE_CHOICES: tuple[str | None, ...] = (*SITES, None)
CPU_TIMES = (3600, 21600, 86400, 259200)  # CPU-time segment bounds: stored as they are
PLATFORMS: tuple[str | None, ...] = ("EL9", "EL8", None)
ALL_TAGS = ("GPU", "SSD", "cvmfs", "HighMem")
TAG_SETS: tuple[frozenset[str], ...] = tuple(frozenset(t) for t in (
    (), ("GPU",), ("SSD",), ("cvmfs",), ("GPU", "SSD"), ("cvmfs", "SSD"), ("HighMem",)))
OWNER_CYCLE = 3 * 4 * 5 * 7 * 11
JOB_MEMORY = 2048

MATCH_PATH = "/api/v1/pilots/match"

# --------------------------------------------------------------------------- the workload


@dataclass(frozen=True)
class QueueSpec:
    """What the jobs of one task queue require."""

    owner: str
    cpu_time: int
    site: str | None
    platform: str | None
    tags: frozenset[str]


def queue_spec(q: int) -> QueueSpec:
    return QueueSpec(owner=f"user{q % 11 + 11 * (q // OWNER_CYCLE)}", cpu_time=CPU_TIMES[q % 4],
                     site=SITE_CHOICES[q % 5], platform=PLATFORMS[q % 3], tags=TAG_SETS[q % 7])


@dataclass(frozen=True)
class Pilot:
    """A pilot's resource, as the benchmark's own rules see it."""

    site: str
    platform: str
    cpu_time: int
    tags: frozenset[str]
    required_tags: frozenset[str]
    processors: int
    memory: int

    def data(self, reference: str, vo: str = VO) -> dict[str, Any]:
        """The resource description the pilot sends."""
        return {"vo": vo, "pilot_reference": reference, "site": self.site,
                "ce": f"ce1.{self.site.lower()}", "platform": self.platform,
                "cpu_time": self.cpu_time, "tags": sorted(self.tags),
                "required_tags": sorted(self.required_tags), "processors": self.processors,
                "memory": self.memory}


def pilot_for(spec: QueueSpec, rng: random.Random, processors: int) -> Pilot:
    """A pilot that can run the jobs of ``spec`` (and, most often, of other queues too)."""
    tags = set(spec.tags) | {t for t in ALL_TAGS if rng.random() < 0.3}
    required = {"GPU"} if "GPU" in spec.tags and rng.random() < 0.5 else set()
    return Pilot(site=spec.site or rng.choice(SITES),
                 platform=spec.platform or rng.choice(("EL9", "EL8")),
                 cpu_time=rng.choice([c for c in CPU_TIMES if c >= spec.cpu_time]),
                 tags=frozenset(tags), required_tags=frozenset(required),
                 processors=processors, memory=JOB_MEMORY * processors)


def matches(spec: QueueSpec, pilot: Pilot) -> bool:
    """The benchmark's own matching rules (docs/ARCHITECTURE.md), for its own workload."""
    return (spec.cpu_time <= pilot.cpu_time
            and (spec.site is None or spec.site == pilot.site)
            and (spec.platform is None or spec.platform == pilot.platform)
            and spec.tags <= pilot.tags and pilot.required_tags <= spec.tags
            and pilot.memory >= JOB_MEMORY)


@dataclass(frozen=True)
class Workload:
    k: int
    #: Queue number of each job, in job order.
    job_queue: list[int]
    priority: list[int]


def make_workload(k: int, jobs: int, seed: int) -> Workload:
    rng = random.Random(f"{seed}-{k}")
    n = max(jobs, k)
    cum = list(itertools.accumulate(1.0 / (1 + r) ** 0.8 for r in range(k)))
    order = list(range(k))
    rng.shuffle(order)  # which queues are the big ones
    job_queue = list(range(k))
    job_queue += [order[min(bisect.bisect_left(cum, rng.random() * cum[-1]), k - 1)]
                  for _ in range(n - k)]
    return Workload(k, job_queue, [1 + rng.randrange(5) for _ in range(n)])


# --------------------------------------------------------------------------- loading


def requirements(vo: str, group: str, spec: QueueSpec) -> Any:
    from taskqueue.core.definitions import JobRequirements

    return JobRequirements(
        vo=vo, owner=spec.owner, owner_group=group, cpu_time=spec.cpu_time, processors=1,
        memory=JOB_MEMORY, sites=frozenset([spec.site]) if spec.site else frozenset(),
        platforms=frozenset([spec.platform]) if spec.platform else frozenset(), tags=spec.tags)


def clear_vos(url: str, vos: Sequence[str]) -> None:
    """Delete the jobs and task queues of ``vos`` (the benchmark's own VOs only)."""
    from sqlalchemy import delete, select

    from taskqueue.db.database import make_engine
    from taskqueue.db.models import (
        history_table,
        job_payloads_table,
        jobs_table,
        task_queues_table,
        tq_banned_sites_table,
        tq_jobs_table,
        tq_platforms_table,
        tq_sites_table,
        tq_tags_table,
    )

    # No statement timeout: beside ten million jobs a VO's removal takes longer than a
    # request's 20 s (bench/ten_million.py).
    engine = make_engine(url, statement_timeout=0)
    try:
        with engine.begin() as conn:
            queues = select(task_queues_table.c.id).where(task_queues_table.c.vo.in_(vos))
            jobs = select(jobs_table.c.id).where(jobs_table.c.vo.in_(vos))
            if conn.dialect.name == "mysql":  # MariaDB: no subquery on the table changed
                queues, jobs = queues.subquery().select(), jobs.subquery().select()
            conn.execute(delete(tq_jobs_table).where(tq_jobs_table.c.tq_id.in_(queues)))
            for table in (tq_sites_table, tq_banned_sites_table, tq_platforms_table,
                          tq_tags_table):
                conn.execute(delete(table).where(table.c.tq_id.in_(queues)))
            conn.execute(delete(history_table).where(history_table.c.job_id.in_(jobs)))
            conn.execute(delete(job_payloads_table).where(
                job_payloads_table.c.job_id.in_(jobs)))
            conn.execute(delete(tq_jobs_table).where(tq_jobs_table.c.job_id.in_(jobs)))
            conn.execute(delete(jobs_table).where(jobs_table.c.vo.in_(vos)))
            conn.execute(delete(task_queues_table).where(task_queues_table.c.vo.in_(vos)))
    finally:
        engine.dispose()


def load(url: str, backend: str, vo: str, group: str, k: int, job_queue: Sequence[int],
         priority: Sequence[int], *, chunk: int = 10_000,
         spec_of: Callable[[int], QueueSpec] = queue_spec) -> list[int]:
    """Bulk-load K queues of ``vo`` and their jobs, in the state the library leaves them
    (Waiting, three history rows, a task_queue_jobs row); return the queues' ids. Queue
    ``q`` requires ``spec_of(q)`` (default :func:`queue_spec`)."""
    from sqlalchemy import insert

    from taskqueue.core.definitions import TaskQueueDefinition
    from taskqueue.core.settings import Settings
    from taskqueue.db.database import make_engine, make_session_factory
    from taskqueue.db.models import (
        task_queues_table,
        tq_platforms_table,
        tq_sites_table,
        tq_tags_table,
    )
    from taskqueue.queues.taskqueues import INITIAL_PRIORITY

    settings = Settings()
    rng = random.Random(f"keys-{vo}-{k}")
    now = datetime.now(UTC)
    counts = [0] * k
    sums = [0] * k
    for q, p in zip(job_queue, priority, strict=True):
        counts[q] += 1
        sums[q] += p
    engine = make_engine(url)
    factory = make_session_factory(engine)
    tq_ids: list[int] = []
    try:
        for lo in range(0, k, chunk):
            part = range(lo, min(lo + chunk, k))
            specs = [spec_of(q) for q in part]
            defs = [TaskQueueDefinition.for_job(requirements(vo, group, s), settings)
                    for s in specs]
            with factory.begin() as session:
                conn = session.connection()
                rows = [queue_ops.with_defaults(task_queues_table, {
                    "digest": d.digest(), "vo": vo, "owner_group": group, "owner": d.owner,
                    "cpu_time": d.cpu_time, "processors": d.processors, "memory": d.memory,
                    "job_type": d.job_type, "submit_pool": None, "expression": None,
                    "priority": INITIAL_PRIORITY, "mean_job_priority": sums[q] / counts[q],
                    "jobs_inserted": counts[q], "active": 1, "created_at": now,
                    "emptied_at": None, "draw_key": rng.expovariate(INITIAL_PRIORITY)})
                    for q, d in zip(part, defs, strict=True)]
                ids = list(conn.execute(
                    insert(task_queues_table).returning(task_queues_table.c.id,
                                                        sort_by_parameter_order=True),
                    rows).scalars())
                for table, attr in ((tq_sites_table, "sites"), (tq_platforms_table, "platforms"),
                                    (tq_tags_table, "tags")):
                    values = [{"tq_id": i, "value": v} for i, d in zip(ids, defs, strict=True)
                              for v in sorted(getattr(d, attr))]
                    if values:
                        conn.execute(insert(table), values)
            tq_ids.extend(ids)
        fill = _copy_jobs if backend == "postgresql" else _insert_jobs
        for lo in range(0, len(job_queue), chunk):
            hi = min(lo + chunk, len(job_queue))
            with factory.begin() as session:
                fill(session, vo, group, range(lo, hi), job_queue, priority, tq_ids, now,
                     spec_of)
    finally:
        engine.dispose()
    return tq_ids


def job_row(vo: str, group: str, i: int, spec: QueueSpec, prio: int, now: datetime
             ) -> dict[str, Any]:
    from taskqueue.core.states import JobStatus
    from taskqueue.db.models import jobs_table

    return queue_ops.with_defaults(jobs_table, {
        "vo": vo, "owner": spec.owner, "owner_group": group,
        "status": JobStatus.WAITING.value, "minor_status": "Pilot Agent Submission",
        "description": (f'[Executable = "stream.sh"; Arguments = "{i}"; Owner = "{spec.owner}";'
                        f' OwnerGroup = "{group}"; CPUTime = {spec.cpu_time}]'),
        "job_type": "User", "user_priority": prio, "cpu_time": spec.cpu_time,
        "processors": 1, "memory": JOB_MEMORY, "submit_pool": None, "submitted_at": now,
        "reschedule_count": 0})


def _insert_jobs(session: Any, vo: str, group: str, numbers: range, job_queue: Sequence[int],
                 priority: Sequence[int], tq_ids: Sequence[int], now: datetime,
                 spec_of: Callable[[int], QueueSpec] = queue_spec) -> None:
    from sqlalchemy import insert

    from taskqueue.db.models import history_table, jobs_table, tq_jobs_table

    conn = session.connection()
    rows = [job_row(vo, group, i, spec_of(job_queue[i]), priority[i], now) for i in numbers]
    ids = list(conn.execute(
        insert(jobs_table).returning(jobs_table.c.id, sort_by_parameter_order=True),
        rows).scalars())
    conn.execute(insert(history_table), [
        {"job_id": jid, "at": now, "status": status, "minor_status": minor, "source": source}
        for jid in ids for status, minor, source in queue_ops.HISTORY])
    conn.execute(insert(tq_jobs_table), [
        {"job_id": jid, "tq_id": tq_ids[job_queue[i]], "rank": -priority[i]}
        for i, jid in zip(numbers, ids, strict=True)])


def _copy_jobs(session: Any, vo: str, group: str, numbers: range, job_queue: Sequence[int],
               priority: Sequence[int], tq_ids: Sequence[int], now: datetime,
               spec_of: Callable[[int], QueueSpec] = queue_spec) -> None:
    """The rows of :func:`_insert_jobs` by PostgreSQL COPY (ids taken from the sequence)."""
    from sqlalchemy import text

    conn = session.connection()
    n = len(numbers)
    last = conn.execute(text("SELECT setval(pg_get_serial_sequence('jobs', 'id'), "
                             "nextval(pg_get_serial_sequence('jobs', 'id')) + :n - 1)"),
                        {"n": n}).scalar_one()
    ids = range(last - n + 1, last + 1)
    naive_now = now.astimezone(UTC).replace(tzinfo=None)
    columns = ["id", *job_row(vo, group, 0, queue_spec(0), 1, now)]
    raw: Any = conn.connection.driver_connection
    with raw.cursor() as cur:
        with cur.copy(f"COPY jobs ({', '.join(columns)}) FROM STDIN") as copy:
            for i, jid in zip(numbers, ids, strict=True):
                row = job_row(vo, group, i, spec_of(job_queue[i]), priority[i], now)
                row["id"] = jid
                row["submitted_at"] = naive_now
                copy.write_row([row[c] for c in columns])
        queue_ops.copy_history(cur, ids, naive_now)
        with cur.copy("COPY task_queue_jobs (job_id, tq_id, rank) FROM STDIN") as copy:
            for i, jid in zip(numbers, ids, strict=True):
                copy.write_row((jid, tq_ids[job_queue[i]], -priority[i]))


def recompute(url: str, vos: Sequence[str], groups: Sequence[str]) -> None:
    """The fair share, once, as the priority agent would after the load."""
    from taskqueue.core.settings import Settings
    from taskqueue.db.database import make_engine, make_session_factory
    from taskqueue.queues.shares import recompute_priorities

    engine = make_engine(url)
    try:
        with make_session_factory(engine).begin() as session:
            recompute_priorities(session, Settings(),
                                 {(vo, g) for vo, g in zip(vos, groups, strict=True)})
    finally:
        engine.dispose()


def waiting_in(url: str, vos: Sequence[str]) -> int:
    from sqlalchemy import func, select

    from taskqueue.db.database import make_engine
    from taskqueue.db.models import jobs_table

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(jobs_table).where(
                jobs_table.c.vo.in_(vos), jobs_table.c.status == "Waiting")).scalar_one())
    finally:
        engine.dispose()


def ensure_background(url: str, backend: str, jobs: int, queues: int, seed: int, *,
                      vos: Sequence[str] = BACKGROUND_VOS,
                      spec_of: Callable[[int], QueueSpec] = queue_spec) -> None:
    """``jobs`` waiting jobs in background VOs (``vos``, some of :data:`BACKGROUND_VOS`),
    each VO's queue ``q`` requiring ``spec_of(q)`` (loaded unless they are there already)."""
    if jobs <= 0:
        return
    if waiting_in(url, BACKGROUND_VOS) == jobs:
        log(f"background: {jobs:,} waiting jobs already loaded")
        return
    clear_vos(url, BACKGROUND_VOS)
    t0 = time.perf_counter()
    per_vo = [jobs // len(vos) + (v < jobs % len(vos)) for v in range(len(vos))]
    k = max(1, queues // len(vos))
    for vo, n in zip(vos, per_vo, strict=True):
        if n:
            kk = min(k, n)
            wl = make_workload(kk, n, seed + 1)
            load(url, backend, vo, f"{vo}_user", kk, wl.job_queue, wl.priority,
                 spec_of=spec_of)
            log(f"background: {vo} loaded, {n:,} jobs over {kk:,} queues")
    recompute(url, vos, [f"{vo}_user" for vo in vos])
    seconds = time.perf_counter() - t0
    emit({"measure": "background_load", "backend": backend, "jobs": jobs, "queues": queues,
          "vos": len(vos), "seconds": round(seconds, 2),
          "method": "COPY" if backend == "postgresql" else "INSERT"})


#: Whether the workload's jobs are loaded with their stored payloads (job_payloads), as a
#: submission stores them; False: as jobs stored before migration 0042, whose match answer
#: parses each description (--stored-payloads no).
STORED_PAYLOADS = True


def load_workload(url: str, backend: str, wl: Workload) -> list[int]:
    clear_vos(url, [VO])
    t0 = time.perf_counter()
    tq_ids = load(url, backend, VO, GROUP, wl.k, wl.job_queue, wl.priority)
    if STORED_PAYLOADS:
        store_missing_payloads(url, VO)
    recompute(url, [VO], [GROUP])
    log(f"K={wl.k}: loaded {len(wl.job_queue):,} jobs in {time.perf_counter() - t0:.1f} s")
    return tq_ids


def job_ids_by_number(url: str, n: int) -> list[int]:
    """The database ids of the workload's jobs, in job order (loaded in that order)."""
    from sqlalchemy import select

    from taskqueue.db.database import make_engine
    from taskqueue.db.models import jobs_table

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ids = list(conn.execute(select(jobs_table.c.id).where(jobs_table.c.vo == VO)
                                    .order_by(jobs_table.c.id)).scalars())
    finally:
        engine.dispose()
    if len(ids) != n:
        raise SystemExit(f"expected {n} jobs of {VO} after the load, found {len(ids)}")
    return ids


def matched_in_database(url: str) -> dict[str, int]:
    """Jobs Matched in the workload's VO and in the background VOs (which must be none)."""
    from sqlalchemy import func, select

    from taskqueue.db.database import make_engine
    from taskqueue.db.models import jobs_table

    engine = make_engine(url)
    c = jobs_table.c
    try:
        with engine.connect() as conn:
            mine = conn.execute(select(func.count()).where(
                c.vo == VO, c.status == "Matched")).scalar_one()
            others = conn.execute(select(func.count()).where(
                c.vo.in_(BACKGROUND_VOS), c.status != "Waiting")).scalar_one()
    finally:
        engine.dispose()
    return {"matched": int(mine), "background_touched": int(others)}


# --------------------------------------------------------------------------- CPU from /proc

def pids_named(*names: str) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                comm = Path(f"/proc/{entry.name}/comm").read_text().strip()
            except OSError:
                continue
            if comm in names:
                out.append(int(entry.name))
    return out


@dataclass
class CpuSample:
    at: float
    #: CPU seconds per database server process (postgres, mariadbd) on this machine.
    server: dict[int, float]
    busy: float
    total: float
    loadavg: float
    #: CPU seconds per thread of a multi-threaded server (mariadbd), (pid, tid) -> seconds.
    threads: dict[tuple[int, int], float] = field(default_factory=dict)


def sample(server_pids: list[int], *, threads: bool = False) -> CpuSample:
    cpu = {p: c for p in server_pids if (c := proc_cpu(p)) is not None}
    per_thread: dict[tuple[int, int], float] = {}
    if threads:
        for pid in server_pids:
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                if (c := proc_cpu(pid, tid)) is not None:
                    per_thread[(pid, tid)] = c
    busy, total = machine_cpu_seconds()
    load1 = float(Path("/proc/loadavg").read_text().split()[0])
    return CpuSample(time.monotonic(), cpu, busy, total, load1, per_thread)


def server_processes(backend: str) -> list[int]:
    if backend == "postgresql":
        return pids_named("postgres")
    if backend == "mariadb":
        return pids_named("mariadbd", "mysqld")
    return []


# --------------------------------------------------------------------------- claimers


@dataclass
class Shared:
    """State the claimers share: which jobs are handed out, waiting jobs per queue."""

    lock: Any
    taken: Any  # byte per job: 1 once handed out
    waiting: Any  # per queue
    stop: Any
    budget: Any


@dataclass(frozen=True)
class ClaimerSpec:
    index: int
    url: str
    k: int
    job_queue: list[int]
    job_ids: list[int]
    processes: int
    count: int
    seed: int
    path: str
    seconds: float
    profile: str | None = None
    http_port: int | None = None
    token: str | None = None
    #: Claimer threads in the process, sharing its databases (in process only).
    threads: int = 1


@dataclass
class ClaimerResult:
    index: int
    latencies: list[float] = field(default_factory=list)
    jobs: int = 0
    empty: int = 0
    misses: int = 0
    miss_samples: list[str] = field(default_factory=list)
    duplicates: int = 0
    violations: int = 0
    violation_samples: list[str] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    cpu_seconds: float = 0.0
    #: The claimer's whole CPU time in the window (drawing pilots and checking included).
    loop_cpu_seconds: float = 0.0
    statements: int = 0
    commits: int = 0
    backend_pids: list[int] = field(default_factory=list)
    #: CPU seconds of this claimer's PostgreSQL backend in the window (read from /proc).
    backend_cpu: float | None = None
    profile: dict[str, Any] | None = None
    cpu_profile: dict[str, Any] | None = None
    first_claim_statements: list[str] | None = None
    fatal: str | None = None
    #: Groups of claims run, and the claims in them (PostgreSQL's group commit).
    groups: int = 0
    grouped_calls: int = 0

    def add(self, other: ClaimerResult) -> None:
        """Count in another thread's claims."""
        self.latencies += other.latencies
        for name in ("jobs", "empty", "misses", "duplicates", "violations", "errors"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.cpu_seconds += other.cpu_seconds
        for name in ("miss_samples", "violation_samples", "error_samples"):
            getattr(self, name).extend(getattr(other, name)[:3])


class Stream:
    """One claimer's pilots: each built from a job drawn among those still waiting."""

    def __init__(self, spec: ClaimerSpec, shared: Shared) -> None:
        self.spec = spec
        self.shared = shared
        self.rng = random.Random(f"{spec.seed}-{spec.k}-{spec.index}")
        self.specs = [queue_spec(q) for q in range(spec.k)]
        self.index_of = {jid: i for i, jid in enumerate(spec.job_ids)}
        self.candidates = list(range(len(spec.job_ids)))
        self.serial = 0

    def next_pilot(self) -> tuple[Pilot, str] | None:
        taken = self.shared.taken
        cand = self.candidates
        while cand:
            pos = self.rng.randrange(len(cand))
            i = cand[pos]
            if taken[i]:
                cand[pos] = cand[-1]
                cand.pop()
                continue
            self.serial += 1
            q = self.spec.job_queue[i]
            return (pilot_for(self.specs[q], self.rng, self.spec.count),
                    f"stream-{os.getpid()}-{self.spec.index}-{self.serial}")
        return None

    def record(self, result: ClaimerResult, pilot: Pilot, job_ids: Sequence[int]) -> None:
        """Check the jobs one pilot got; count an empty answer that was a miss."""
        shared = self.shared
        if not job_ids:
            result.empty += 1
            with shared.lock:
                waiting = sum(shared.waiting[q] for q in range(self.spec.k)
                              if matches(self.specs[q], pilot))
            # Other claimers may hold (uncommitted, or not yet counted) that many jobs.
            if waiting > (self.spec.processes - 1) * self.spec.count:
                result.misses += 1
                if len(result.miss_samples) < 3:
                    result.miss_samples.append(f"{pilot} while {waiting} such jobs waited")
            return
        with shared.lock:
            for jid in job_ids:
                i = self.index_of.get(jid)
                if i is None or not matches(self.specs[self.spec.job_queue[i]], pilot):
                    result.violations += 1
                    if len(result.violation_samples) < 3:
                        result.violation_samples.append(f"job {jid} to {pilot}")
                    if i is None:
                        continue
                if shared.taken[i]:
                    result.duplicates += 1
                    continue
                shared.taken[i] = 1
                shared.waiting[self.spec.job_queue[i]] -= 1
        result.jobs += len(job_ids)


def _take_budget(shared: Shared) -> bool:
    with shared.budget.get_lock():
        if shared.budget.value <= 0 or shared.stop.value:
            return False
        shared.budget.value -= 1
        return True


def claimer(spec: ClaimerSpec, shared: Shared, barrier: Any, results: Any) -> None:
    """One claimer process (in process, or an HTTP client)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    result = ClaimerResult(spec.index)
    try:
        if spec.http_port is not None:
            _http_loop(spec, shared, barrier, result)
        else:
            _in_process_loop(spec, shared, barrier, result)
        result.loop_cpu_seconds = time.process_time() - result.loop_cpu_seconds
    except BaseException:  # report, so that the parent does not wait for ever
        result.fatal = traceback.format_exc()
        shared.stop.value = 1
    results.put(result)


def _in_process_loop(spec: ClaimerSpec, shared: Shared, barrier: Any,
                     result: ClaimerResult) -> None:
    from sqlalchemy import event, text

    from taskqueue.core.errors import ConflictError
    from taskqueue.core.resources import parse_resource
    from taskqueue.db.database import make_engine, make_session_factory, run_in_transaction
    from taskqueue.pilots.pilotmatch import SERVER_CLAIMS, MatchDatabase

    engine = make_engine(spec.url, pool_size=spec.threads)
    factory = make_session_factory(engine)
    autocommit = (make_engine(spec.url, pool_size=spec.threads, autocommit=True)
                  if engine.dialect.name in SERVER_CLAIMS
                  and spec.path in ("matcher", "claim_function") else None)
    match_db = MatchDatabase(factory, autocommit)
    counter = {"statements": 0, "commits": 0}
    first_claim: list[str] | None = None  # the statements of the first claim, once

    @event.listens_for(engine, "before_cursor_execute")
    def _count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        counter["statements"] += 1
        if first_claim is not None:
            first_claim.append(" ".join(statement.split())[:160])

    @event.listens_for(engine, "commit")
    def _commit(*_args: Any) -> None:
        counter["commits"] += 1
        if first_claim is not None:
            first_claim.append("COMMIT")

    if autocommit is not None:
        # One call of the claim function per checkout (of a group's, on PostgreSQL): one
        # statement, committed.
        @event.listens_for(autocommit, "checkout")
        def _call(*_args: Any) -> None:
            counter["statements"] += 1
            counter["commits"] += 1
            if first_claim is not None:
                first_claim.append("SELECT ... FROM gridpilot_claim(...) (autocommit)"
                                   if autocommit.dialect.name == "postgresql"
                                   else "CALL gridpilot_claim(...)")

        # Every connection the threads may hold at once, open before the clock starts, so
        # that the server's CPU is read for each of them.
        held = [autocommit.connect() for _ in range(spec.threads)]
        for conn in held:
            if autocommit.dialect.name == "postgresql":
                result.backend_pids.append(
                    int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()))
            else:
                conn.execute(text("SELECT 1"))
        for conn in held:
            conn.close()
    with engine.connect() as conn:  # the pooled connection, open before the clock starts
        if engine.dialect.name == "postgresql":
            result.backend_pids.append(
                int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()))
        else:
            conn.execute(text("SELECT 1"))
    profiler: Any = None
    cpu_profiler: Any = None
    if spec.profile and spec.profile.endswith(".cpu"):
        import cProfile

        cpu_profiler = cProfile.Profile(time.process_time)
    elif spec.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
    barrier.wait()
    counter["statements"] = counter["commits"] = 0
    result.loop_cpu_seconds = time.process_time()
    first_claim = [] if spec.index == 0 else None
    backend_cpu0 = _cpu_of(result.backend_pids)
    deadline = time.monotonic() + spec.seconds

    # The process's pilots, drawn by its threads in turn (one stream per thread would have
    # each of them skip every job the others took: the benchmark's work, not the claims');
    # a miss allows for every other claimer.
    stream = Stream(replace(spec, processes=spec.processes * spec.threads), shared)
    stream_lock = threading.Lock()

    def claims(thread: int, mine: ClaimerResult) -> None:
        nonlocal first_claim
        claim_rng = random.Random(f"claim-{spec.seed}-{spec.index}-{thread}")
        perf, cpu = time.perf_counter, time.thread_time
        while time.monotonic() < deadline and _take_budget(shared):
            with stream_lock:
                drawn = stream.next_pilot()
            if drawn is None:
                break
            pilot, reference = drawn
            data = pilot.data(reference)
            t0, c0 = perf(), cpu()
            try:
                resource = parse_resource(data)
                if spec.path == "claim_function" and autocommit is not None:
                    job_ids = _claim_function_only(autocommit, match_db.groups,
                                                   resource=resource, now=datetime.now(UTC),
                                                   count=spec.count, rng=claim_rng)
                elif spec.path in ("matcher", "python"):
                    job_ids = _match_as_the_matcher(match_db, resource=resource,
                                                    now=datetime.now(UTC), count=spec.count,
                                                    rng=claim_rng)
                else:
                    job_ids = run_in_transaction(factory, functools.partial(
                        _claim_jobs_only, resource=resource, now=datetime.now(UTC),
                        count=spec.count, rng=claim_rng))
            except ConflictError as exc:
                mine.errors += 1
                if len(mine.error_samples) < 3:
                    mine.error_samples.append(str(exc))
                continue
            mine.cpu_seconds += cpu() - c0
            mine.latencies.append(perf() - t0)
            if first_claim is not None and thread == 0:
                result.first_claim_statements, first_claim = first_claim, None
            stream.record(mine, pilot, job_ids)

    if profiler is not None:
        profiler.start()
    if cpu_profiler is not None:
        cpu_profiler.enable()
    try:
        if spec.threads == 1:
            claims(0, result)
        else:
            parts = [ClaimerResult(spec.index) for _ in range(spec.threads)]
            failures: list[BaseException] = []

            def run(thread: int) -> None:
                try:
                    claims(thread, parts[thread])
                except BaseException as exc:  # the process reports it
                    failures.append(exc)
                    shared.stop.value = 1

            workers = [threading.Thread(target=run, args=(t,)) for t in range(spec.threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            for part in parts:
                result.add(part)
            if failures:
                raise failures[0]
    finally:
        if profiler is not None:
            profiler.stop()
            result.profile = profile_summary(profiler, spec.profile or "")
        if cpu_profiler is not None:
            cpu_profiler.disable()
            result.cpu_profile = cpu_profile_summary(cpu_profiler, spec.profile or "")
    if match_db.groups is not None:
        result.groups, result.grouped_calls = match_db.groups.groups, match_db.groups.calls
    result.statements, result.commits = counter["statements"], counter["commits"]
    if backend_cpu0 is not None:
        end = _cpu_of(result.backend_pids)
        result.backend_cpu = None if end is None else end - backend_cpu0
    engine.dispose()
    if autocommit is not None:
        autocommit.dispose()


def _cpu_of(pids: list[int]) -> float | None:
    """The summed CPU seconds of the claimer's database backends (None: one is unknown)."""
    readings = [proc_cpu(pid) for pid in pids]
    if not readings or None in readings:
        return None
    return sum(r for r in readings if r is not None)


def _match_as_the_matcher(db: Any, *, resource: Any, now: datetime, count: int,
                          rng: random.Random) -> list[int]:
    """What the matcher's match endpoint runs (matcher/pilots.py): taskqueue.pilots.pilotmatch."""
    from optimizers.classads import expression_check
    from taskqueue.pilots.pilotmatch import match_for_pilot

    answer = match_for_pilot(db, resource, now=now, count=count, rng=rng,
                             expression_check=expression_check(resource))
    return [job.id for job in answer.jobs]


def _claim_function_only(engine: Any, groups: Any, *, resource: Any, now: datetime,
                         count: int, rng: random.Random) -> list[int]:
    """The database's claim function alone (one call), as the match path calls it."""
    from taskqueue.pilots import pilotmatch

    _kind, _detail, jobs, _claims = pilotmatch._claim_on_server(
        engine, groups, resource, now=now, count=count, rng=rng, with_expressions=True)
    return [job.id for job in jobs]


def _claim_jobs_only(session: Any, *, resource: Any, now: datetime, count: int,
                     rng: random.Random) -> list[int]:
    from taskqueue.matching.claim import claim_jobs

    return [c.job_id for c in claim_jobs(session, resource, now=now, count=count, rng=rng)]


def _http_loop(spec: ClaimerSpec, shared: Shared, barrier: Any, result: ClaimerResult) -> None:
    assert spec.http_port is not None
    headers = {"Authorization": f"Bearer {spec.token}", "Content-Type": "application/json",
               "Accept": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", spec.http_port, timeout=60)
    stream = Stream(spec, shared)
    barrier.wait()
    result.loop_cpu_seconds = time.process_time()
    deadline = time.monotonic() + spec.seconds
    perf, cpu = time.perf_counter, time.process_time
    try:
        while time.monotonic() < deadline and _take_budget(shared):
            drawn = stream.next_pilot()
            if drawn is None:
                break
            pilot, reference = drawn
            body = json.dumps({"resource": pilot.data(reference), "count": spec.count}).encode()
            t0, c0 = perf(), cpu()
            try:
                conn.request("POST", MATCH_PATH, body, headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                result.errors += 1
                if len(result.error_samples) < 3:
                    result.error_samples.append(f"{type(exc).__name__}: {exc}")
                continue
            result.cpu_seconds += cpu() - c0
            if response.status != 200:
                result.errors += 1
                if len(result.error_samples) < 3:
                    result.error_samples.append(f"HTTP {response.status}: {data[:200]!r}")
                continue
            result.latencies.append(perf() - t0)
            jobs = json.loads(data).get("jobs") or []
            stream.record(result, pilot, [int(j["job_id"]) for j in jobs])
    finally:
        conn.close()


# --------------------------------------------------------------------------- profile summary

#: Builtin functions that wait for the database's answer (a socket), not Python work.
_WAITS = ("recv", "wait", "poll", "select")
#: Builtin functions of the sqlite3 module: the database itself, run in process.
_SQLITE = ("execute", "executemany", "fetchone", "fetchall", "fetchmany", "commit", "rollback")


def _category(file_path: str, function: str, caller: str) -> str:
    """Where a frame's own time goes: the library its file belongs to; a builtin's time goes
    to its caller's, except socket waits and SQLite's own work."""
    fp = file_path.replace("\\", "/")
    if not fp or fp.startswith("<"):
        name = function.rsplit(".", 1)[-1]
        if any(w in name for w in _WAITS):
            return "database_wait"
        if name in _SQLITE and caller.startswith("sqlalchemy"):
            return "sqlite_engine"
        return caller
    if "/psycopg" in fp and function.rsplit(".", 1)[-1].startswith("wait"):
        return "database_wait"  # psycopg waits for the socket in C, under Connection.wait
    for name, marker in (("pymysql", "/pymysql/"), ("psycopg", "/psycopg"),
                         ("sqlalchemy_orm", "/sqlalchemy/orm/"),
                         ("sqlalchemy_core", "/sqlalchemy/")):
        if marker in fp:
            return name
    if "/site-packages/" in fp:
        return "other_libraries"
    if "/bench/" in fp:
        return "benchmark"
    if any(f"/{pkg}/" in fp for pkg in ("taskqueue", "optimizers", "matcher", "gridpilot")):
        return "gridpilot"
    if "/lib/python" in fp:
        return "python_stdlib"
    return "other"


def cpu_profile_summary(profile: Any, path: str) -> dict[str, Any]:
    """Write the cProfile statistics (CPU time of this process, time.process_time) to
    ``path``; split the CPU time by library, a builtin's time going to its callers'."""
    import pstats

    stats = pstats.Stats(profile)
    stats.dump_stats(path)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]

    def category(func: tuple[str, int, str]) -> str | None:
        file_path, _line, name = func
        if file_path == "~":
            return None
        return _category(file_path, name, "other")

    totals: dict[str, float] = {}
    for func, (_cc, _nc, tottime, _ct, callers) in raw.items():
        own = category(func)
        if own is None:  # a builtin: its time goes to its callers' libraries
            named = re.search(r"(?:method|function) '?([\w.]+)", func[2])
            name = named.group(1) if named else func[2]
            parts = {c: v[2] for c, v in callers.items()} or {("", 0, ""): tottime}
            whole = sum(parts.values()) or 1.0
            for caller, t in parts.items():
                where = _category("", name, category(caller) or "other")
                totals[where] = totals.get(where, 0.0) + tottime * t / whole
        else:
            totals[own] = totals.get(own, 0.0) + tottime
    whole = sum(totals.values()) or 1.0
    return {"file": path, "cpu_seconds": round(whole, 3),
            "share": {k: round(v / whole, 3)
                      for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}}


def profile_summary(profiler: Any, path: str) -> dict[str, Any]:
    """Write pyinstrument's text report to ``path``; split the sampled (wall) time by library,
    with the time spent waiting on the database's socket apart."""
    session = profiler.last_session
    Path(path).write_text(profiler.output_text(unicode=False, color=False, show_all=False))
    totals: dict[str, float] = {}

    def walk(frame: Any, caller: str) -> None:
        if frame.is_synthetic:  # "[self]": the parent's own time
            totals[caller] = totals.get(caller, 0.0) + frame.time
            return
        own = _category(frame.file_path or "", frame.function or "", caller)
        for child in frame.children:
            walk(child, own)

    root = session.root_frame()
    if root is not None:
        walk(root, "other")
    whole = sum(totals.values()) or 1.0
    return {"file": path, "seconds": round(session.duration, 3),
            "share": {k: round(v / whole, 3)
                      for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}}


# --------------------------------------------------------------------------- a measurement


def measure(url: str, backend: str, wl: Workload, job_ids: list[int], *, processes: int,
            count: int, seed: int, path: str, claims: int, seconds: float,
            profile: str | None, http: dict[str, Any] | None = None,
            threads: int = 1, stop: Any = None, on_start: Any = None) -> dict[str, Any]:
    """One measurement. ``stop`` (a spawn-context Value("i")) ends it early when set to 1 by
    another process; ``on_start`` (a spawn-context Event) is set when the clock starts."""
    ctx = mp.get_context("spawn")
    waiting = [0] * wl.k
    for q in wl.job_queue:
        waiting[q] += 1
    shared = Shared(lock=ctx.Lock(), taken=ctx.Array("b", len(job_ids), lock=False),
                    waiting=ctx.Array("l", waiting, lock=False),
                    stop=stop if stop is not None else ctx.Value("i", 0),
                    budget=ctx.Value("l", claims))
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    specs = [ClaimerSpec(i, url, wl.k, wl.job_queue, job_ids, processes, count, seed, path,
                         seconds, profile if i == 0 else None,
                         http["port"] if http else None, http["token"] if http else None,
                         threads)
             for i in range(processes)]
    procs = [ctx.Process(target=claimer, args=(s, shared, barrier, results), daemon=True)
             for s in specs]
    start_together(procs, barrier, timeout=300, what="the claimers")
    per_thread = backend == "mariadb"
    a = sample(server_processes(backend), threads=per_thread)
    if on_start is not None:
        on_start.set()
    gunicorn_a = tree_cpu_seconds(http["pid"]) if http else None
    outcome: list[ClaimerResult] = [results.get() for _ in procs]
    b = sample(server_processes(backend), threads=per_thread)
    server_pids = list(b.server)
    gunicorn_b = tree_cpu_seconds(http["pid"]) if http else None
    for p in procs:
        p.join(timeout=30)
    for r in outcome:
        if r.fatal:
            log(f"claimer {r.index} failed:\n{r.fatal}")
    window = b.at - a.at
    lat = sorted(x for r in outcome for x in r.latencies)
    done = len(lat)
    jobs = sum(r.jobs for r in outcome)
    client_cpu = sum(r.cpu_seconds for r in outcome)
    # The claimers' own backends end with their connections before the last sample: their
    # CPU is the claimers' reading, added to that of the server's other processes.
    own_pids = {pid for r in outcome for pid in r.backend_pids}
    server_all = sum(cpu - a.server.get(pid, 0.0) for pid, cpu in b.server.items()
                     if pid not in own_pids)
    own = [r.backend_cpu for r in outcome]
    own_backends = sum(x for x in own if x is not None) if own and None not in own else None
    server_all += own_backends or 0.0
    # MariaDB serves each connection from a thread of its own: the busiest threads in the
    # window (as many as claimers) are, most likely, the claimers' (an estimate).
    busiest: float | None = None
    if b.threads:
        deltas = sorted((c - a.threads.get(key, 0.0) for key, c in b.threads.items()),
                        reverse=True)
        busiest = sum(deltas[:processes])
    busy = b.busy - a.busy
    total = b.total - a.total
    statements = sum(r.statements for r in outcome)
    commits = sum(r.commits for r in outcome)
    db = matched_in_database(url)

    def per_claim(x: float | None) -> float | None:
        return None if x is None or not done else round(x * 1000 / done, 3)

    gunicorn_cpu = (gunicorn_b - gunicorn_a) if http and gunicorn_a is not None \
        and gunicorn_b is not None else None
    mine = sum(r.loop_cpu_seconds for r in outcome) + server_all + (gunicorn_cpu or 0.0)
    record: dict[str, Any] = {
        "measure": "pilot_stream_http" if http else "pilot_stream", "backend": backend,
        "k": wl.k, "jobs_loaded": len(job_ids), "processes": processes,
        "threads_per_process": threads, "count": count,
        "path": "http" if http else path, "claims": done, "jobs": jobs,
        "seconds": round(window, 3), "claims_per_s": rate(done, window),
        "jobs_per_s": rate(jobs, window),
        "p50_ms": percentile_ms(lat, 0.50), "p99_ms": percentile_ms(lat, 0.99),
        "empty_answers": sum(r.empty for r in outcome),
        "misses": sum(r.misses for r in outcome),
        "duplicates": sum(r.duplicates for r in outcome),
        "violations": sum(r.violations for r in outcome) + db["background_touched"],
        "errors": sum(r.errors for r in outcome) + sum(1 for r in outcome if r.fatal),
        "database_agrees": db["matched"] == jobs,
        "client_cpu_ms_per_claim": per_claim(client_cpu),
        # The claimers' whole CPU: the claims, and the benchmark's own drawing and checking.
        "claimer_process_cpu_ms_per_claim": per_claim(sum(r.loop_cpu_seconds
                                                          for r in outcome)),
        "server_cpu_ms_per_claim": per_claim(own_backends if own_backends is not None
                                             else server_all),
        "server_cpu_scope": ("own backends" if own_backends is not None else
                             f"all {backend} processes (other users' work included)"
                             if server_pids else "not on this host"),
        "server_all_cpu_ms_per_claim": per_claim(server_all) if server_pids else None,
        "server_busiest_threads_cpu_ms_per_claim": per_claim(busiest),
        "statements_per_claim": round(statements / done, 2) if done and not http else None,
        "commits_per_claim": round(commits / done, 2) if done and not http else None,
        "load": {"cores": os.cpu_count(), "busy_cores": round(busy / window, 2) if window else None,
                 "other_cores": round((busy - mine) / window, 2) if window else None,
                 "idle_share": round(1 - busy / total, 3) if total else None,
                 "loadavg_1m_before": a.loadavg, "loadavg_1m_after": b.loadavg},
    }
    groups = sum(r.groups for r in outcome)
    if groups:
        record["claims_per_group"] = round(sum(r.grouped_calls for r in outcome) / groups, 2)
    if http:
        record["workers"] = http["workers"]
        record["worker_threads"] = http["threads"]
        record["matcher_cpu_ms_per_claim"] = per_claim(gunicorn_cpu)
    record["stored_payloads"] = STORED_PAYLOADS
    for key, attr in (("miss_samples", "miss_samples"), ("violation_samples",
                                                         "violation_samples"),
                      ("error_samples", "error_samples")):
        found = [s for r in outcome for s in getattr(r, attr)][:3]
        if found:
            record[key] = found
    if not record["database_agrees"]:
        record["database_matched"] = db["matched"]
    profiles = [r.profile for r in outcome if r.profile]
    if profiles:
        record["profile"] = profiles[0]
    firsts = [r.first_claim_statements for r in outcome if r.first_claim_statements]
    if firsts:
        record["first_claim_statements"] = firsts[0]
    cpu_profiles = [r.cpu_profile for r in outcome if r.cpu_profile]
    if cpu_profiles:
        record["cpu_profile"] = cpu_profiles[0]
    return record

# --------------------------------------------------------------------------- main

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", default=None,
                        help="SQLAlchemy URL of a database the benchmark may write its own VOs "
                             "into (default: an SQLite file in a temporary folder)")
    parser.add_argument("--jobs", type=int, default=20_000,
                        help="waiting jobs of the workload (at least K; default 20000)")
    parser.add_argument("--k", type=int_list, default=[10, 100, 1000, 100_000],
                        help="comma list of task-queue counts (default 10,100,1000,100000)")
    parser.add_argument("--processes", type=int_list, default=[1, 4],
                        help="comma list of claimer process counts, in process (default 1,4)")
    parser.add_argument("--threads", type=int_list, default=[1],
                        help="claimer threads per in-process claimer, sharing its databases "
                             "(their claims are grouped per commit on PostgreSQL), comma-"
                             "separated (default 1)")
    parser.add_argument("--counts", type=int_list, default=[1],
                        help="comma list of jobs asked for per claim (default 1)")
    parser.add_argument("--path", choices=("matcher", "python", "claim_jobs", "claim_function"),
                        default="matcher",
                        help="in process: what the matcher's match endpoint runs "
                             "(taskqueue.pilots.pilotmatch.match_for_pilot, default), the "
                             "same without the database's claim function (its Python path, "
                             "as on SQLite), claim_jobs alone, or the database's claim "
                             "function alone (PostgreSQL, MariaDB)")
    parser.add_argument("--claims", type=int, default=None,
                        help="claims per measurement (default: as many as jobs)")
    parser.add_argument("--seconds", type=float, default=120.0,
                        help="stop a measurement after this many seconds (default 120)")
    parser.add_argument("--seed", type=int, default=1, help="the workload's seed (default 1)")
    parser.add_argument("--calibration-seconds", type=float, default=3.0,
                        help="seconds of each calibration loop (SELECT 1; single-row UPDATE "
                             "and durable COMMIT), run before each K (default 3)")
    parser.add_argument("--background-jobs", type=int, default=0,
                        help="waiting jobs in four other VOs (default 0; the issue asks for "
                             "1000000)")
    parser.add_argument("--background-queues", type=int, default=1000,
                        help="task queues of the background jobs (default 1000)")
    parser.add_argument("--http", action="store_true",
                        help="also claim over HTTP against gridpilot serve (gunicorn)")
    parser.add_argument("--http-only", action="store_true", help="only over HTTP")
    parser.add_argument("--clients", type=int_list, default=[8],
                        help="comma list of HTTP client process counts (default 8)")
    parser.add_argument("--workers", type=int, default=2,
                        help="gunicorn workers over HTTP (default 2)")
    parser.add_argument("--matcher-threads", type=int, default=4,
                        help="threads per matcher worker over HTTP (matcher.threads: "
                             "gunicorn's gthread when more than 1; default 4, the service's; "
                             "1: sync workers)")
    parser.add_argument("--http-counts", type=int_list, default=[1, 4],
                        help="comma list of jobs per HTTP match request (default 1,4)")
    parser.add_argument("--stored-payloads", choices=("yes", "no"), default="yes",
                        help="load the jobs with their stored payloads (job_payloads), as a "
                             "submission stores them (default); no: as jobs stored before "
                             "migration 0041, whose match answer parses each description")
    parser.add_argument("--profile", default=None,
                        help="profile the first claimer of each 1-process measurement with "
                             "pyinstrument; its text report goes to PROFILE-<backend>-k<K>.txt")
    parser.add_argument("--cpu-profile", default=None,
                        help="instead, profile the claimer's CPU time with cProfile "
                             "(time.process_time); statistics go to PREFIX-<backend>-k<K>.cpu")
    args = parser.parse_args(argv)
    if args.profile and args.cpu_profile:
        parser.error("--profile and --cpu-profile exclude each other")
    if args.calibration_seconds <= 0:
        parser.error("--calibration-seconds must be positive")
    if args.jobs < 1 or args.seconds <= 0 or (args.claims is not None and args.claims < 1):
        parser.error("--jobs, --seconds and --claims must be positive")
    if args.background_jobs < 0 or args.background_queues < 1:
        parser.error("--background-jobs must not be negative, --background-queues positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    end_on_signals()
    global STORED_PAYLOADS
    STORED_PAYLOADS = args.stored_payloads == "yes"
    if args.path == "claim_function" and backend_of(args.url or "sqlite://") not in (
            "postgresql", "mariadb"):
        raise SystemExit("--path claim_function needs PostgreSQL or MariaDB (a database "
                         "with the claim function)")
    tmpdir = Path(tempfile.mkdtemp(prefix="gp_pilot_stream_"))
    url = args.url or f"sqlite:///{tmpdir / 'stream.db'}"
    backend = backend_of(url)
    started = time.perf_counter()
    try:
        upgrade_schema(url)
        emit(queue_ops.server_info(url, backend))
        ensure_background(url, backend, args.background_jobs, args.background_queues,
                          args.seed)
        for k in args.k:
            wl = make_workload(k, args.jobs, args.seed)
            # The machine's floor, measured again for each K: the ratios below compare
            # figures taken minutes apart at most.
            calibration = cal.calibrate(url, backend, seconds=args.calibration_seconds)
            calibration["k"] = k
            emit(calibration)
            log(f"K={k}: calibration: SELECT 1 {calibration['select_1']['per_s']}/s, "
                f"UPDATE+COMMIT {calibration['update_commit']['per_s']}/s (server "
                f"{calibration['update_commit']['server_cpu_ms']} ms, client "
                f"{calibration['update_commit']['client_cpu_ms']} ms per call)")
            claims = args.claims or len(wl.job_queue)
            plan: list[tuple[str, int, int, int]] = []
            if not args.http_only:
                plan += [("in_process", p, t, c) for p in args.processes
                         for t in args.threads for c in args.counts]
            if args.http or args.http_only:
                plan += [("http", n, 1, c) for n in args.clients for c in args.http_counts]
            for mode, processes, threads, count in plan:
                load_workload(url, backend, wl)
                queue_ops.analyze(url, backend, vacuum=True)
                job_ids = job_ids_by_number(url, len(wl.job_queue))
                profile = (f"{args.profile}-{backend}-k{k}.txt"
                           if args.profile and processes == 1 and mode == "in_process"
                           else f"{args.cpu_profile}-{backend}-k{k}.cpu"
                           if args.cpu_profile and processes == 1 and mode == "in_process"
                           else None)
                log(f"K={k}: {mode}, {processes} claimer(s) of {threads} thread(s), {count} "
                    "job(s) per claim")
                if mode == "http":
                    record = _measure_http(url, backend, wl, job_ids, args, processes, count,
                                           claims, tmpdir)
                else:
                    record = measure(url, backend, wl, job_ids, processes=processes,
                                     count=count, seed=args.seed, path=args.path,
                                     claims=claims, seconds=args.seconds, profile=profile,
                                     threads=threads)
                record["background_jobs"] = args.background_jobs
                record["ratios"] = cal.ratios(record, calibration)
                emit(record)
                log(f"  {record['claims_per_s']} claims/s, p50 {record['p50_ms']} ms, p99 "
                    f"{record['p99_ms']} ms, misses {record['misses']}, duplicates "
                    f"{record['duplicates']}, violations {record['violations']}, client "
                    f"{record['client_cpu_ms_per_claim']} ms/claim, server "
                    f"{record['server_cpu_ms_per_claim']} ms/claim, load {record['load']}")
                log(f"  as multiples of the floor: {record['ratios']}")
            clear_vos(url, [VO])
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    log(f"done in {time.perf_counter() - started:.0f} s")
    return 0


def _measure_http(url: str, backend: str, wl: Workload, job_ids: list[int],
                  args: argparse.Namespace, clients: int, count: int, claims: int,
                  tmpdir: Path) -> dict[str, Any]:
    """The same stream over HTTP: gunicorn started by bench/matcher_http.py's helper."""
    from matcher.auth import issue_token


    secret = secrets.token_urlsafe(32)
    token = issue_token(secret, subject="stream-pilots", role="pilot", vo=VO,
                        group="benchvo_pilot", lifetime=86400)
    with matcher_http.running_server(url, args.workers, config=ROOT / "conf" / "gridpilot.toml",
                           secret=secret, tmpdir=tmpdir, max_requests=0,
                           threads=args.matcher_threads) as server:
        return measure(url, backend, wl, job_ids, processes=clients, count=count,
                       seed=args.seed, path="http", claims=claims, seconds=args.seconds,
                       profile=None, http={"port": server.port, "token": token,
                                           "pid": server.pid, "workers": args.workers,
                                           "threads": args.matcher_threads})


__all__ = ["asdict", "main"]

if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt as interrupt:
        log(f"interrupted ({interrupt or 'Ctrl-C'})")
        raise SystemExit(130) from None
