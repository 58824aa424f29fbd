"""Jobs per VO and status kept by the database's triggers (migration 0028) and folded by
taskqueue.db.jobcounts: after every kind of change they must equal a count of the jobs table
(plus the jobs purged), and a change not yet committed is neither lost nor counted twice."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.orm import Session

from gridpilot import schema
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db import jobcounts
from taskqueue.db.database import make_engine, make_session_factory, run_in_transaction
from taskqueue.db.models import (
    Job,
    job_count_deltas_table,
    jobs_table,
    purged_jobs_table,
    tq_jobs_table,
)
from taskqueue.pilots.pilotmatch import match_for_pilot
from taskqueue.pilots.pilotreports import Beat, heartbeat
from taskqueue.queues.jobcontrol import kill_job, reschedule_job
from taskqueue.queues.jobs import apply_transition
from taskqueue.queues.purge import purge_batch, purged_counts
from taskqueue.queues.taskqueues import remove_jobs_from_queues
from tests.conftest import Database, _server_database
from tests.helpers import requirements, submit


def _counted(db: Database) -> dict[tuple[str, str], int]:
    """What the totals must be: the jobs table counted, and the jobs purged from it."""
    j = jobs_table.c
    with db.factory() as s:
        out = {(vo, status): int(n) for vo, status, n in s.execute(
            select(j.vo, j.status, func.count()).group_by(j.vo, j.status))}
        for key, n in purged_counts(s).items():
            out[key] = out.get(key, 0) + n
    return out


def _folded(db: Database) -> dict[tuple[str, str], int]:
    """The totals after a fold; the waiting jobs per task queue are checked on the way."""
    with db.factory.begin() as s:
        jobcounts.fold(s)
    q = tq_jobs_table.c
    with db.factory() as s:
        assert jobcounts.waiting(s) == {int(tq_id): int(n) for tq_id, n in s.execute(
            select(q.tq_id, func.count()).group_by(q.tq_id))}
        return jobcounts.totals(s)


def test_the_totals_follow_every_change(db: Database, settings: Settings, now: datetime
                                        ) -> None:
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements()] * 6 + [requirements(vo="belle")] * 2)
    assert _folded(db) == _counted(db) == {("lhcb", "Waiting"): 6, ("belle", "Waiting"): 2}
    answer = match_for_pilot(db.matches, parse_resource({"vo": "lhcb", "pilot_reference": "p"}),
                             now=now, count=3)
    assert len(answer.jobs) == 3
    running = answer.jobs[0].id
    with db.factory.begin() as s:
        apply_transition(s, [running], JobStatus.MATCHED, JobStatus.RUNNING,
                         minor_status="started", source="test", now=now)
        kill_job(s, ids[-1], by="olga", now=now)
        reschedule_job(s, answer.jobs[1].id, by="olga", now=now, reason="test",
                       max_reschedules=5, fail_when_exhausted=True)
    assert _folded(db) == _counted(db)
    # A change that changes no status writes nothing to fold.
    with db.factory.begin() as s:
        s.execute(update(Job).where(Job.id == ids[0]).values(minor_status="looked at"))
    with db.factory() as s:
        assert jobcounts.fold(s) == 0
    # Purged jobs still count in their last status.
    with db.factory.begin() as s:
        s.execute(update(Job).where(Job.id == running).values(
            status="Done", ended_at=now - timedelta(days=90)))
    before = _folded(db)
    with db.factory.begin() as s:
        batch = purge_batch(s, status="Done", before=now - timedelta(days=30), limit=10)
    assert batch.by_vo == {"lhcb": 1}
    assert _folded(db) == before == _counted(db)
    assert before[("lhcb", "Done")] == 1


def _deltas(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(job_count_deltas_table)) or 0)


def test_a_heartbeat_counts_nothing_and_bulk_changes_count_exactly(
        db: Database, settings: Settings, now: datetime) -> None:
    """A heartbeat sets no status: it writes no delta (on PostgreSQL it calls no counting
    function at all); a bulk submission, a claim and a bulk kill keep the totals exact."""
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements(owner=f"u{i % 3}") for i in range(40)]
                     + [requirements(vo="belle")] * 3)
    assert _folded(db) == _counted(db) == {("lhcb", "Waiting"): 40, ("belle", "Waiting"): 3}
    answer = match_for_pilot(db.matches, parse_resource({"vo": "lhcb", "pilot_reference": "p"}),
                             now=now, count=3)
    matched = [j.id for j in answer.jobs]
    assert len(matched) == 3
    with db.factory.begin() as s:
        apply_transition(s, matched[:2], JobStatus.MATCHED, JobStatus.RUNNING,
                         minor_status="started", source="test", now=now)
    assert _folded(db) == _counted(db)
    postgresql = db.backend == "postgresql"
    calls = text("SELECT coalesce(pg_stat_get_xact_function_calls("
                 "'gridpilot_count_changed_jobs()'::regprocedure), 0)")
    with db.factory.begin() as s:
        if postgresql:  # the calls of PL/pgSQL functions, counted in this transaction
            s.execute(text("SET LOCAL track_functions = 'pl'"))
        assert _deltas(s) == 0
        commands = heartbeat(s, vo="lhcb", pilot_reference="p",
                             beats=[Beat(matched[0], cpu_used=10.0, progress="half"),
                                    Beat(matched[1], output_tail="line")], now=now)
        assert commands == {}
        assert _deltas(s) == 0
        if postgresql:
            assert s.scalar(calls) == 0
        # The same transaction's status change is counted: the probe sees the trigger's call.
        apply_transition(s, [matched[2]], JobStatus.MATCHED, JobStatus.RUNNING,
                         minor_status="started", source="test", now=now)
        assert _deltas(s) == 2
        if postgresql:
            assert s.scalar(calls) == 1
    assert _folded(db) == _counted(db)
    waiting = [i for i in ids[:40] if i not in matched]
    with db.factory.begin() as s:
        assert remove_jobs_from_queues(s, waiting, now=now) == len(waiting)
        apply_transition(s, waiting, JobStatus.WAITING, JobStatus.KILLED,
                         minor_status="Killed by olga", source="olga", now=now,
                         values={"ended_at": now})
    assert _folded(db) == _counted(db) == {("lhcb", "Killed"): 37, ("lhcb", "Running"): 3,
                                           ("belle", "Waiting"): 3}


def test_a_fold_takes_only_what_is_committed(db: Database, settings: Settings, now: datetime
                                              ) -> None:
    with db.factory.begin() as s:
        early, held, late = submit(s, settings, now, [requirements()] * 3)
    _folded(db)

    def kill(session: Session, job_id: int) -> None:
        session.execute(update(Job).where(Job.id == job_id).values(status="Killed"))

    with db.factory.begin() as s:
        kill(s, early)
    writer = db.factory()
    try:
        kill(writer, held)  # its deltas fall between the other two changes' deltas
        writer.flush()
        if db.backend != "sqlite":  # SQLite has one writer at a time
            with db.factory.begin() as s:
                kill(s, late)
            assert _folded(db) == {("lhcb", "Waiting"): 1, ("lhcb", "Killed"): 2}
        writer.commit()
    finally:
        writer.close()
    if db.backend == "sqlite":
        with db.factory.begin() as s:
            kill(s, late)
    assert _folded(db) == _counted(db) == {("lhcb", "Killed"): 3}


def test_the_migration_counts_the_jobs_already_there(database: Database, settings: Settings,
                                                     now: datetime, tmp_path: Path) -> None:
    """Revision 0028 on a database with jobs (some purged, some changed with no trigger to
    see it, as before it): the totals start as their count; down again, the triggers go."""
    urls = (iter([f"sqlite:///{tmp_path / 'gridpilot.db'}"]) if database.backend == "sqlite"
            else _server_database(database.backend))
    url = next(urls)
    engine = make_engine(url)
    try:
        schema.upgrade(engine)
        factory = make_session_factory(engine)
        with factory.begin() as s:
            first, *_ = submit(s, replace(settings, database=replace(settings.database,
                                                                     url=url)),
                               now, [requirements()] * 3)
        config = schema.alembic_config(engine)
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0027")
        with factory.begin() as s:
            s.execute(update(Job).where(Job.id == first).values(status="Done"))
            s.execute(insert(purged_jobs_table).values(vo="lhcb", status="Done", jobs=5))
        with factory.begin() as s:
            s.execute(update(Job).where(Job.id == first).values(status="Failed"))
        with factory.begin() as s:  # and the queue row of a job that is no longer waiting
            s.execute(delete(tq_jobs_table).where(tq_jobs_table.c.job_id == first))
        schema.upgrade(engine)
        with factory() as s:
            assert jobcounts.totals(s) == {("lhcb", "Waiting"): 2, ("lhcb", "Failed"): 1,
                                           ("lhcb", "Done"): 5}
            assert list(jobcounts.waiting(s).values()) == [2]
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0027")
        with factory.begin() as s:  # no trigger left to write into a table that is gone
            s.execute(update(Job).where(Job.id == first).values(status="Killed"))
    finally:
        engine.dispose()
        next(urls, None)  # drops a server's database


def test_folds_meanwhile_claims_lose_and_double_nothing(db: Database, settings: Settings,
                                                        now: datetime) -> None:
    """Claimers (the matcher's own path) and two loops of folds at once; SQLite, one writer
    at a time, runs them too, in turns."""
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(owner=f"u{i % 7}") for i in range(160)])
    done = threading.Event()
    errors: list[BaseException] = []
    claimed: list[int] = []

    def claimer(n: int) -> None:
        try:
            while True:
                answer = match_for_pilot(
                    db.matches, parse_resource({"vo": "lhcb", "pilot_reference": f"p{n}"}),
                    now=now, count=2)
                if not answer.jobs:
                    return
                claimed.extend(j.id for j in answer.jobs)
        except BaseException as exc:
            errors.append(exc)

    def folder() -> None:
        try:
            while not done.is_set():
                run_in_transaction(db.factory, jobcounts.fold)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    folding = [threading.Thread(target=folder) for _ in range(2)]
    for t in folding + threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    for t in folding:
        t.join(60)
    assert not errors, errors
    assert len(claimed) == len(set(claimed)) == 160
    assert _folded(db) == _counted(db) == {("lhcb", "Matched"): 160}


def test_a_fold_goes_by_batches_and_leaves_the_rest_once_its_time_is_up(
        db: Database, settings: Settings, now: datetime, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """Deltas piled up while no activity loop ran are folded over several turns, a batch at a
    time, none lost or counted twice."""
    monkeypatch.setattr(jobcounts, "FOLD_BATCH", 2)
    monkeypatch.setattr(jobcounts, "PG_FOLD_BATCH", 2)
    monkeypatch.setattr(jobcounts, "FOLD_SECONDS", 0.0)  # one batch per table and fold
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(owner=f"u{i}") for i in range(5)])
        submit(s, settings, now, [requirements(owner=f"u{i}", vo="belle", owner_group="b")
                                  for i in range(5)])
    folds = []
    while True:
        with db.factory.begin() as s:
            folds.append(jobcounts.fold(s))
        if not folds[-1]:
            break
    assert len(folds) > 2 and max(folds) <= 4
    assert _folded(db) == _counted(db) == {("lhcb", "Waiting"): 5, ("belle", "Waiting"): 5}
