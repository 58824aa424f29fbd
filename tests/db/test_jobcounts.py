"""Jobs per VO and status kept by the database's triggers (migration 0028) and folded by
taskqueue.jobcounts: after every kind of change they must equal a count of the jobs table
(plus the jobs purged), and a change not yet committed is neither lost nor counted twice."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from taskqueue import jobcounts
from taskqueue.jobcontrol import kill_job, reschedule_job
from taskqueue.jobs import apply_transition
from taskqueue.models import Job, jobs_table
from taskqueue.pilotmatch import match_for_pilot
from taskqueue.purge import purge_batch, purged_counts
from taskqueue.resources import parse_resource
from taskqueue.settings import Settings
from taskqueue.states import JobStatus
from tests.conftest import Database
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
    with db.factory.begin() as s:
        jobcounts.fold(s)
    with db.factory() as s:
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
