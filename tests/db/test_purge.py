"""The purge of ended jobs, on every database: what the retentions remove and what they keep
(never a job that has not ended), what goes with a job (history, queue rows, sandbox
references, sandboxes no job needs any more, in either store), the dashboard's totals, and a
purge that meets a job a change in progress holds."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select, update

from agents.context import AgentContext
from agents.purge import purge_ended_jobs
from pilot.archive import Member, pack, sandbox_id
from taskqueue.core.settings import Settings
from taskqueue.db.models import Job, PilotRun, history_table, jobs_table, tq_jobs_table
from taskqueue.files.sandboxes import (
    INPUT,
    OUTPUT,
    Uploader,
    find_sandbox,
    reference,
    register_sandbox,
)
from taskqueue.files.sandboxstore import open_store
from taskqueue.pilots.activity import latest_snapshot, record_activity
from taskqueue.pilots.records import record_run
from taskqueue.queues.jobcontrol import kill_job, reschedule_job
from taskqueue.queues.purge import purge_batch, purged_counts
from tests.conftest import Database
from tests.helpers import requirements, submit

DAY = timedelta(days=1)
ALICE = Uploader("lhcb", "alice", "lhcb_user")


def _set(db: Database, job_id: int, status: str, ended: datetime | None) -> None:
    with db.factory.begin() as session:
        session.execute(update(Job).where(Job.id == job_id).values(status=status,
                                                                   ended_at=ended))


def _jobs(db: Database) -> set[int]:
    with db.factory() as session:
        return set(session.scalars(select(jobs_table.c.id)))


def _context(db: Database, settings: Settings, now: datetime, batch: int = 500
             ) -> AgentContext:
    settings = replace(settings, purge=replace(settings.purge, batch=batch))
    return AgentContext(settings, db.factory, clock=lambda: now)


def test_jobs_ended_past_their_retention_leave_with_their_history(
        db: Database, settings: Settings, now: datetime) -> None:
    long_ago = now - 100 * DAY
    with db.factory.begin() as session:
        ids = submit(session, settings, long_ago, [requirements()] * 9)
    done_old, done_new, failed_old, failed_new, killed, running, waiting, stalled, deleted = ids
    _set(db, done_old, "Done", now - 31 * DAY)
    _set(db, done_new, "Done", now - 29 * DAY)
    _set(db, failed_old, "Failed", now - 61 * DAY)
    _set(db, failed_new, "Failed", now - 59 * DAY)
    with db.factory.begin() as session:
        kill_job(session, killed, by="olga", now=now - 40 * DAY)
    # Still running (or waiting, or stalled) however old, and whatever an end time says.
    _set(db, running, "Running", now - 90 * DAY)
    _set(db, stalled, "Stalled", None)
    # Deleted before it ever ran: no end time, its submission 100 days ago counts.
    _set(db, deleted, "Deleted", None)
    with db.factory() as session:
        assert session.scalar(select(func.count()).select_from(tq_jobs_table).where(
            tq_jobs_table.c.job_id == killed)) == 0
        queued_before = set(session.scalars(select(tq_jobs_table.c.job_id)))
    assert done_old in queued_before  # moved to Done behind the queue's back: its row goes too

    summary = purge_ended_jobs(_context(db, settings, now, batch=1))

    gone = {done_old, failed_old, killed, deleted}
    assert summary.startswith("4 ended job(s) purged (Done 1, Killed 1, Failed 1, Deleted 1)")
    assert _jobs(db) == set(ids) - gone
    with db.factory() as session:
        history = set(session.scalars(select(history_table.c.job_id).distinct()))
        queued = set(session.scalars(select(tq_jobs_table.c.job_id)))
        assert purged_counts(session) == {("lhcb", "Done"): 1, ("lhcb", "Failed"): 1,
                                          ("lhcb", "Killed"): 1, ("lhcb", "Deleted"): 1}
    assert history == set(ids) - gone
    assert not queued & gone and waiting in queued
    # A second turn finds nothing more; the counters add up across turns.
    assert purge_ended_jobs(_context(db, settings, now)).startswith("0 ended job(s) purged,")
    _set(db, done_new, "Done", now - 31 * DAY)
    assert purge_ended_jobs(_context(db, settings, now)).startswith("1 ended job(s) purged")
    with db.factory() as session:
        assert purged_counts(session)[("lhcb", "Done")] == 2


def test_the_pilots_notes_of_a_purged_job_leave_with_it(db: Database, settings: Settings,
                                                        now: datetime) -> None:
    """pilot_runs rows (migration 0029) of purged jobs stayed for ever."""
    with db.factory.begin() as session:
        old, kept = submit(session, settings, now - 100 * DAY, [requirements()] * 2)
    _set(db, old, "Done", now - 31 * DAY)
    _set(db, kept, "Done", now - 1 * DAY)
    with db.factory.begin() as session:
        for reference, job in (("pilot-1", old), ("pilot-2", old), ("pilot-2", kept)):
            record_run(session, "lhcb", reference, job, now=now - 40 * DAY)
    assert purge_ended_jobs(_context(db, settings, now)).startswith("1 ended job(s) purged")
    with db.factory() as session:
        assert set(session.execute(select(PilotRun.pilot_reference, PilotRun.job_id))) == {
            ("pilot-2", kept)}


def test_a_retention_of_zero_keeps_the_status(db: Database, settings: Settings,
                                              now: datetime) -> None:
    with db.factory.begin() as session:
        (job,) = submit(session, settings, now - 400 * DAY, [requirements()])
    _set(db, job, "Failed", now - 300 * DAY)
    settings = replace(settings, purge=replace(settings.purge, failed=0))
    assert purge_ended_jobs(_context(db, settings, now)).startswith("0 ended job(s) purged")
    assert _jobs(db) == {job}


def test_only_ended_jobs_can_be_purged(db: Database, now: datetime) -> None:
    with db.factory.begin() as session, pytest.raises(ValueError, match="not 'Running'"):
        purge_batch(session, status="Running", before=now, limit=10)


def test_the_dashboards_counts_keep_their_totals(db: Database, settings: Settings,
                                                 now: datetime) -> None:
    with db.factory.begin() as session:
        ids = submit(session, settings, now - 50 * DAY, [requirements()] * 3
                     + [requirements(vo="dteam", owner="bob", owner_group="dteam_user")])
    for job in ids[:2] + ids[3:]:
        _set(db, job, "Done", now - 40 * DAY)
    with db.factory.begin() as session:
        record_activity(session, now=now)
        before = {vo: latest_snapshot(session, vo).by_status for vo in ("lhcb", "dteam")}
    assert before == {"lhcb": {"Done": 2, "Waiting": 1}, "dteam": {"Done": 1}}
    purge_ended_jobs(_context(db, settings, now))
    assert _jobs(db) == {ids[2]}
    later = now + timedelta(minutes=5)
    with db.factory.begin() as session:
        record_activity(session, now=later)
        after = {vo: latest_snapshot(session, vo) for vo in ("lhcb", "dteam")}
    assert all(s.at is not None and s.at > now for s in after.values())
    assert {vo: s.by_status for vo, s in after.items()} == before


def _stored(db: Database, settings: Settings, name: str, at: datetime) -> str:
    data = pack([Member(name, name.encode())])
    sid = sandbox_id(data)
    open_store(settings).put(sid, data)
    with db.factory.begin() as session:
        register_sandbox(session, sid, len(data), ALICE, now=at)
    return sid


def test_sandboxes_no_job_needs_leave_the_store(db: Database, sandbox_settings: Settings,
                                                now: datetime) -> None:
    settings = sandbox_settings
    store = open_store(settings)
    old = now - 50 * DAY
    only_purged = _stored(db, settings, "only-purged", old)
    output = _stored(db, settings, "output", old)
    shared = _stored(db, settings, "shared", old)
    recent = _stored(db, settings, "recent", now - 2 * DAY)  # uploaded again lately
    with db.factory.begin() as session:
        purged, kept = submit(session, settings, old, [requirements()] * 2)
        reference(session, [(purged, only_purged), (purged, shared), (kept, shared),
                            (purged, recent)], INPUT)
        reference(session, [(purged, output)], OUTPUT)
    _set(db, purged, "Done", now - 40 * DAY)

    summary = purge_ended_jobs(_context(db, settings, now), store)

    assert "1 ended job(s) purged" in summary and "2 sandbox(es) removed" in summary
    assert _jobs(db) == {kept}
    with db.factory() as session:
        recorded = {s for s in (only_purged, output, shared, recent)
                    if find_sandbox(session, s) is not None}
    assert recorded == {shared, recent}
    assert store.size(only_purged) is None and store.size(output) is None
    assert sorted(store.keys()) == sorted(recorded)


def test_a_job_changed_before_the_purge_reads_it_stays(db: Database, settings: Settings,
                                                       now: datetime) -> None:
    with db.factory.begin() as session:
        (job,) = submit(session, settings, now - 50 * DAY, [requirements()])
    _set(db, job, "Done", now - 40 * DAY)
    with db.factory.begin() as session:
        reschedule_job(session, job, by="olga", now=now, reason="again", max_reschedules=5,
                       fail_when_exhausted=False)
    assert purge_ended_jobs(_context(db, settings, now)).startswith("0 ended job(s) purged")
    assert _jobs(db) == {job}


def test_a_purge_skips_a_job_a_change_in_progress_holds(db: Database, settings: Settings,
                                                        now: datetime) -> None:
    """A reschedule holds the ended job's row: the purge neither waits for it nor removes the
    job; once the reschedule commits, the job is no longer ended and stays."""
    if not db.is_server:
        pytest.skip("SQLite has one writer at a time: no change is in progress during a purge")
    with db.factory.begin() as session:
        job, other = submit(session, settings, now - 50 * DAY, [requirements()] * 2)
    _set(db, job, "Done", now - 40 * DAY)
    _set(db, other, "Done", now - 40 * DAY)
    with db.factory.begin() as holder:
        reschedule_job(holder, job, by="olga", now=now, reason="again", max_reschedules=5,
                       fail_when_exhausted=False)
        summary = purge_ended_jobs(_context(db, settings, now))
        assert summary.startswith("1 ended job(s) purged (Done 1), 0 skipped")
        assert _jobs(db) == {job}
    with db.factory() as session:
        assert session.get(Job, job).status == "Received"  # type: ignore[union-attr]
    assert purge_ended_jobs(_context(db, settings, now)).startswith("0 ended job(s) purged")
    assert _jobs(db) == {job}


def test_the_purge_pauses_between_batches(db: Database, settings: Settings,
                                          now: datetime) -> None:
    with db.factory.begin() as session:
        ids = submit(session, settings, now - 50 * DAY, [requirements()] * 3)
    for job in ids:
        _set(db, job, "Done", now - 40 * DAY)
    settings = replace(settings, purge=replace(settings.purge, batch=1, pause=0.25))
    pauses: list[float] = []
    summary = purge_ended_jobs(AgentContext(settings, db.factory, clock=lambda: now),
                               sleep=pauses.append)
    assert summary.startswith("3 ended job(s) purged")
    # After each full batch (the fourth finds nothing and ends the status's pass).
    assert pauses == [0.25] * 3
