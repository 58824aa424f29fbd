"""What the grid did, kept for the dashboard: jobs matched, done and failed per site and
minute, and snapshots of the jobs per status, rolled up into hours and days and pruned.

Nothing on the claim or report paths writes here. The activity loop (``gridpilot agents
activity``) derives the counters from what those paths record anyway: the job status history
(its ``status, at`` index finds the recent changes) and the jobs' sites. Each turn recomputes
the minutes from ``SETTLE`` before its previous turn on from scratch (so a transaction that
commits a little late is still counted, minutes when no agent ran the loop are filled in, and
running the loop twice changes nothing), then the hours and days those minutes belong to, then
takes a snapshot of the jobs per status from the counts the database keeps as jobs change
(taskqueue.db.jobcounts: no count of the jobs table). Every matcher process reads the same rows.

A job rescheduled before the loop saw its match no longer names a site; its match is counted
under the site "" (shown as "no site").
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Integer, delete, func, literal_column, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from taskqueue.core.states import JobStatus
from taskqueue.db import jobcounts
from taskqueue.db.bulk import insert_rows
from taskqueue.db.models import (
    TaskQueue,
    history_table,
    job_counts_table,
    jobs_table,
    site_activity_table,
)

MINUTE, HOUR, DAY = 60, 3600, 86400
PERIODS = (MINUTE, HOUR, DAY)
#: Minutes recomputed at every turn: a change committed this long after its time still counts.
SETTLE = timedelta(minutes=3)
#: History statuses counted, and the counter each one feeds.
COUNTED = {JobStatus.MATCHED.value: "matched", JobStatus.DONE.value: "done",
           JobStatus.FAILED.value: "failed"}

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Retention:
    """How long each tier of rows is kept."""

    minutes: timedelta = timedelta(hours=48)
    hours: timedelta = timedelta(days=60)
    days: timedelta = timedelta(days=800)

    def of(self, period: int) -> timedelta:
        return {MINUTE: self.minutes, HOUR: self.hours, DAY: self.days}[period]


class epoch_minute(FunctionElement[int]):
    """Whole minutes since 1970 of a naive-UTC timestamp column, in each dialect's words."""

    type = Integer()
    inherit_cache = True


@compiles(epoch_minute, "postgresql")
def _pg_minute(element: epoch_minute, compiler: SQLCompiler, **kw: Any) -> str:
    return f"CAST(floor(extract(epoch FROM {compiler.process(element.clauses, **kw)}) / 60) " \
           "AS BIGINT)"


@compiles(epoch_minute, "mysql")
def _mysql_minute(element: epoch_minute, compiler: SQLCompiler, **kw: Any) -> str:
    # TIMESTAMPDIFF, not UNIX_TIMESTAMP: the latter reads the value in the session's zone.
    return f"TIMESTAMPDIFF(MINUTE, '1970-01-01 00:00:00', " \
           f"{compiler.process(element.clauses, **kw)})"


@compiles(epoch_minute, "sqlite")
def _sqlite_minute(element: epoch_minute, compiler: SQLCompiler, **kw: Any) -> str:
    # Whole seconds only: SQLite rounds "12:00:59.9999" up into the next minute.
    column = compiler.process(element.clauses, **kw)
    return f"(CAST(strftime('%s', substr({column}, 1, 19)) AS INTEGER) / 60)"


def floor_time(moment: datetime, period: int) -> datetime:
    """The start of the period (minute, hour, day, counted in UTC from 1970) holding
    ``moment``."""
    seconds = int((moment - EPOCH).total_seconds())
    return EPOCH + timedelta(seconds=seconds - seconds % period)


@dataclass(frozen=True)
class TurnSummary:
    minutes: int
    pruned: int
    snapshot_rows: int
    #: Waiting jobs per non-empty task queue, as the snapshot counted them.
    waiting: dict[int, int]

    def line(self) -> str:
        return (f"{self.minutes} site-minute rows recomputed, {self.snapshot_rows} counts "
                f"in the snapshot, {self.pruned} old rows pruned")


def record_activity(session: Session, *, now: datetime,
                    retention: Retention = Retention()) -> TurnSummary:
    """One turn of the activity loop: recent minutes, their hours and days, a snapshot of the
    jobs per status, and the pruning of rows past their retention."""
    since = floor_time(_first_unsettled(session, now, retention), MINUTE)
    minutes = _recompute_minutes(session, since, now)
    for finer, coarser in ((MINUTE, HOUR), (HOUR, DAY)):
        _roll_up(session, finer, coarser, floor_time(since, coarser), now)
    jobcounts.fold(session)
    waiting = jobcounts.waiting(session)
    snapshot = _snapshot(session, floor_time(now, MINUTE), waiting)
    pruned = _prune(session, now, retention)
    return TurnSummary(minutes, pruned, snapshot, waiting)


def _first_unsettled(session: Session, now: datetime, retention: Retention) -> datetime:
    """Where a turn starts recomputing: ``SETTLE`` before the last turn (every minute since
    then is filled from the history, however long no turn ran), ``SETTLE`` before now on the
    first turn, never further back than the minutes are kept."""
    c = job_counts_table.c
    last = session.execute(select(func.max(c.at)).where(c.period == MINUTE,
                                                         c.at <= now)).scalar()
    start = min(now, last) - SETTLE if last is not None else now - SETTLE
    return max(start, now - retention.minutes)


def _recompute_minutes(session: Session, since: datetime, now: datetime) -> int:
    h, j = history_table.c, jobs_table.c
    minute = epoch_minute(h.at)
    site = func.coalesce(j.site, literal_column("''"))
    rows = session.execute(
        select(minute.label("minute"), j.vo, site.label("site"), h.status,
               func.count().label("n"))
        .join_from(history_table, jobs_table, j.id == h.job_id)
        .where(h.status.in_(list(COUNTED)), h.at >= since, h.at <= now)
        .group_by(minute, j.vo, site, h.status)).all()
    counts: dict[tuple[datetime, str, str], dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(COUNTED.values(), 0))
    for row in rows:
        start = EPOCH + timedelta(minutes=int(row.minute))
        counts[(start, row.vo, row.site)][COUNTED[row.status]] += int(row.n)
    _replace(session, MINUTE, since, now, counts)
    return len(counts)


def _replace(session: Session, period: int, since: datetime, until: datetime,
             counts: dict[tuple[datetime, str, str], dict[str, int]]) -> None:
    a = site_activity_table.c
    session.execute(delete(site_activity_table).where(
        a.period == period, a.start >= since, a.start <= until))
    insert_rows(session.connection(), site_activity_table, [
        {"period": period, "start": start, "vo": vo, "site": site, **values}
        for (start, vo, site), values in sorted(counts.items())])


def _roll_up(session: Session, finer: int, coarser: int, since: datetime,
             now: datetime) -> None:
    """The ``coarser`` rows from ``since`` on, summed again from the ``finer`` ones."""
    a = site_activity_table.c
    counts: dict[tuple[datetime, str, str], dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(COUNTED.values(), 0))
    for row in session.execute(select(a.start, a.vo, a.site, a.matched, a.done, a.failed)
                               .where(a.period == finer, a.start >= since)):
        key = (floor_time(row.start, coarser), row.vo, row.site)
        for name in COUNTED.values():
            counts[key][name] += getattr(row, name)
    _replace(session, coarser, since, now, counts)


def _snapshot(session: Session, at: datetime, waiting: dict[int, int]) -> int:
    """Jobs per status and waiting jobs per owner group (``waiting``: per task queue), for
    each VO, at minute ``at``; the first snapshot of each hour and of each day is kept in
    those tiers as well (the counts as of the turn's fold)."""
    values: list[tuple[str, str, str, int]] = [
        (vo, "status", status, n)
        for (vo, status), n in sorted(jobcounts.totals(session).items())]
    groups: Counter[tuple[str, str]] = Counter()
    for tq_id, vo, group in session.execute(
            select(TaskQueue.id, TaskQueue.vo, TaskQueue.owner_group)):
        if waiting.get(tq_id):
            groups[(vo, group)] += waiting[tq_id]
    values += [(vo, "owner_group", group, n) for (vo, group), n in sorted(groups.items())]
    c = job_counts_table.c
    tiers = [MINUTE]
    for period in (HOUR, DAY):
        start = floor_time(at, period)
        taken = session.execute(select(c.at).where(
            c.period == period, c.at >= start, c.at < start + timedelta(seconds=period))
            .limit(1)).first()
        if taken is None or taken.at == at:
            tiers.append(period)
    session.execute(delete(job_counts_table).where(c.period.in_(tiers), c.at == at))
    insert_rows(session.connection(), job_counts_table, [
        {"period": period, "at": at, "vo": vo, "dimension": dim, "value": value, "jobs": n}
        for period in tiers for vo, dim, value, n in values])
    return len(values)


def _prune(session: Session, now: datetime, retention: Retention) -> int:
    removed = 0
    a, c = site_activity_table.c, job_counts_table.c
    conn = session.connection()
    for period in PERIODS:
        cutoff = now - retention.of(period)
        removed += conn.execute(delete(site_activity_table).where(
            a.period == period, a.start < cutoff)).rowcount
        removed += conn.execute(delete(job_counts_table).where(
            c.period == period, c.at < cutoff)).rowcount
    return removed


# -- reading -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Snapshot:
    """The newest snapshot of a VO's job counts."""

    at: datetime | None
    by_status: dict[str, int]
    waiting_by_group: dict[str, int]


def latest_snapshot(session: Session, vo: str) -> Snapshot:
    c = job_counts_table.c
    at = session.scalar(select(func.max(c.at)).where(c.period == MINUTE, c.vo == vo))
    if at is None:
        return Snapshot(None, {}, {})
    status: dict[str, int] = {}
    groups: dict[str, int] = {}
    for dim, value, n in session.execute(select(c.dimension, c.value, c.jobs).where(
            c.period == MINUTE, c.at == at, c.vo == vo)):
        (status if dim == "status" else groups)[value] = int(n)
    return Snapshot(at, status, groups)


@dataclass(frozen=True)
class Series:
    """Points of one or more named lines over time, oldest first."""

    times: list[datetime]
    lines: dict[str, list[int]]


def status_series(session: Session, vo: str, *, since: datetime, period: int,
                  statuses: Sequence[str]) -> Series:
    """The snapshots of the tier ``period`` since ``since``: jobs in each of ``statuses``."""
    c = job_counts_table.c
    points: dict[datetime, dict[str, int]] = defaultdict(dict)
    for at, value, n in session.execute(select(c.at, c.value, c.jobs).where(
            c.period == period, c.vo == vo, c.dimension == "status", c.at >= since,
            c.value.in_(list(statuses)))):
        points[at][value] = int(n)
    times = sorted(points)
    return Series(times, {s: [points[t].get(s, 0) for t in times] for s in statuses})


def activity_series(session: Session, vo: str, *, since: datetime, until: datetime,
                    period: int, site: str | None = None) -> Series:
    """Matched, done and failed per ``period`` from ``since`` to ``until`` (every period
    present, zero where nothing happened), for one site or all."""
    a = site_activity_table.c
    since = floor_time(since, period)
    stmt = (select(a.start, func.sum(a.matched), func.sum(a.done), func.sum(a.failed))
            .where(a.period == period, a.vo == vo, a.start >= since, a.start <= until)
            .group_by(a.start))
    if site is not None:
        stmt = stmt.where(a.site == site)
    found = {row[0]: (int(row[1]), int(row[2]), int(row[3])) for row in session.execute(stmt)}
    times = []
    t = since
    while t <= until:
        times.append(t)
        t += timedelta(seconds=period)
    empty = (0, 0, 0)
    return Series(times, {name: [found.get(t, empty)[i] for t in times]
                          for i, name in enumerate(COUNTED.values())})


@dataclass(frozen=True)
class SiteTotals:
    matched: int = 0
    done: int = 0
    failed: int = 0

    @property
    def failure_rate(self) -> float | None:
        """Failed among the jobs that ended, or None when none ended."""
        ended = self.done + self.failed
        return self.failed / ended if ended else None


def site_totals(session: Session, vo: str, *, since: datetime) -> dict[str, SiteTotals]:
    """Per site, the jobs matched, done and failed since ``since`` (minute rows)."""
    a = site_activity_table.c
    return {site: SiteTotals(int(m), int(d), int(f)) for site, m, d, f in session.execute(
        select(a.site, func.sum(a.matched), func.sum(a.done), func.sum(a.failed))
        .where(a.period == MINUTE, a.vo == vo, a.start >= since).group_by(a.site))}


def jobs_failed_since(session: Session, vo: str, *, since: datetime) -> int:
    """How many of the VO's jobs failed since ``since``, each once however often it failed
    (a rescheduled job may fail again); read as :func:`recent_failures` reads."""
    h, j = history_table.c, jobs_table.c
    return int(session.scalar(
        select(func.count(func.distinct(h.job_id)))
        .join_from(history_table, jobs_table, j.id == h.job_id)
        .where(h.status == JobStatus.FAILED.value, h.at >= since, j.vo == vo)) or 0)


def recent_failures(session: Session, vo: str, *, since: datetime,
                    limit: int = 20) -> list[tuple[str, int]]:
    """The minor statuses of the VO's jobs that failed since ``since``, most frequent first
    (read from the history's ``status, at`` index, so it costs what failed, not what ran)."""
    h, j = history_table.c, jobs_table.c
    n = func.count().label("n")
    return [(reason, int(count)) for reason, count in session.execute(
        select(h.minor_status, n).join_from(history_table, jobs_table, j.id == h.job_id)
        .where(h.status == JobStatus.FAILED.value, h.at >= since, j.vo == vo)
        .group_by(h.minor_status).order_by(n.desc(), h.minor_status).limit(limit))]
