"""The pilot registry."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, insert, select, update

from taskqueue.core.errors import InvalidInputError
from taskqueue.core.settings import Settings
from taskqueue.db.models import DirectorQueue, Job, Pilot, history_table
from taskqueue.pilots.records import (
    PILOT_STATES,
    PilotInfo,
    failed_start_streak,
    idle_pilot_streak,
    last_pilot_report,
    lock_director_queue,
    record_new_pilots,
    record_run,
    record_submission,
    register_pilot,
    retry_queue,
    runs_of_pilot,
    set_pilot_status,
    starts_stopped,
    stop_for_failed_starts,
)
from tests.conftest import Database
from tests.helpers import requirements, submit


def pilots(db: Database) -> list[Pilot]:
    with db.factory() as s:
        return list(s.scalars(select(Pilot).order_by(Pilot.reference)))


def test_register_creates_the_pilot(db: Database, now: datetime) -> None:
    with db.factory.begin() as s:
        pilot = register_pilot(s, "lhcb", PilotInfo("p-1", "LCG.Alpha.org", "ce1", "long",
                                                    "Submitted"), now=now)
        assert pilot.id is not None
    (stored,) = pilots(db)
    assert (stored.reference, stored.vo, stored.site, stored.ce, stored.queue, stored.status,
            stored.submitted_at, stored.last_seen_at) == (
        "p-1", "lhcb", "LCG.Alpha.org", "ce1", "long", "Submitted", now, now)


def test_second_registration_updates_the_record(db: Database, now: datetime) -> None:
    later = now + timedelta(minutes=20)
    with db.factory.begin() as s:
        register_pilot(s, "lhcb", PilotInfo("p-1", "LCG.Alpha.org", "ce1", "long", "Submitted"),
                       now=now)
    with db.factory.begin() as s:
        register_pilot(s, "lhcb", PilotInfo("p-1", "LCG.Alpha.org", "ce2", "short", "Running"),
                       now=later)
        register_pilot(s, "lhcb", PilotInfo("p-2", "LCG.Beta.org", "ce9", "q", "Waiting"),
                       now=later)
    first, second = pilots(db)
    assert (first.reference, first.ce, first.queue, first.status, first.submitted_at,
            first.last_seen_at) == ("p-1", "ce2", "short", "Running", now, later)
    assert (second.reference, second.status, second.submitted_at) == ("p-2", "Waiting", later)
    with db.factory() as s:
        assert s.scalar(select(func.count()).select_from(Pilot)) == 2


def test_same_reference_in_another_vo_is_another_pilot(db: Database, now: datetime) -> None:
    with db.factory.begin() as s:
        register_pilot(s, "lhcb", PilotInfo("p-1", "LCG.Alpha.org", "ce1", "long", "Running"),
                       now=now)
    with db.factory.begin() as s:
        theirs = register_pilot(s, "belle", PilotInfo("p-1", "LCG.Beta.org", "ce2", "q",
                                                      "Done"), now=now + timedelta(minutes=1))
        assert (theirs.vo, theirs.status) == ("belle", "Done")
    with db.factory.begin() as s:  # each VO's record moves on its own
        register_pilot(s, "lhcb", PilotInfo("p-1", "LCG.Alpha.org", "ce1", "long", "Running"),
                       now=now + timedelta(minutes=2))
    by_vo = {p.vo: p for p in pilots(db)}
    assert (by_vo["lhcb"].site, by_vo["lhcb"].status, by_vo["lhcb"].last_seen_at) == (
        "LCG.Alpha.org", "Running", now + timedelta(minutes=2))
    assert (by_vo["belle"].site, by_vo["belle"].status) == ("LCG.Beta.org", "Done")


@pytest.mark.parametrize("info", [
    PilotInfo("p-1", "LCG.Alpha.org", "ce1", "long", "Flying"),
    PilotInfo("p-1", "LCG.Alpha.org", "ce1", "long", "running"),
    PilotInfo("p-1", "LCG.Alpha.org", "ce1", "long", ""),
    PilotInfo("  ", "LCG.Alpha.org", "ce1", "long", "Running"),
], ids=["unknown status", "status in the wrong case", "empty status", "empty reference"])
def test_invalid_registrations_are_refused(db: Database, now: datetime,
                                           info: PilotInfo) -> None:
    with db.factory.begin() as s, pytest.raises(InvalidInputError):
        register_pilot(s, "lhcb", info, now=now)
    assert pilots(db) == []


def test_bad_status_on_update_leaves_the_record(db: Database, now: datetime) -> None:
    with db.factory.begin() as s:
        register_pilot(s, "lhcb", PilotInfo("p-1", "S", "ce1", "q", "Running"), now=now)
    with db.factory.begin() as s, pytest.raises(InvalidInputError):
        register_pilot(s, "lhcb", PilotInfo("p-1", "S", "ce1", "q", "Gone"), now=now)
    assert [p.status for p in pilots(db)] == ["Running"]


@pytest.mark.parametrize("status", PILOT_STATES)
def test_every_pilot_state_is_accepted(db: Database, now: datetime, status: str) -> None:
    with db.factory.begin() as s:
        register_pilot(s, "lhcb", PilotInfo("p-1", "S", "ce1", "q", status), now=now)
    assert [p.status for p in pilots(db)] == [status]


def test_concurrent_first_registrations_make_one_record(db: Database, now: datetime) -> None:
    """Two first registrations of one pilot at once: one creates, the other updates."""
    later = now + timedelta(seconds=1)
    errors: list[BaseException] = []

    def second() -> None:
        try:
            with db.factory.begin() as s:
                register_pilot(s, "lhcb", PilotInfo("p-1", "S", "ce1", "q", "Running"),
                               now=later)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with db.factory.begin() as s:
        register_pilot(s, "lhcb", PilotInfo("p-1", "S", "ce1", "q", "Submitted"), now=now)
        s.flush()
        other = threading.Thread(target=second)
        other.start()  # blocks on this uncommitted record (or the SQLite write lock)
        time.sleep(0.5)
    other.join(timeout=60)
    assert not other.is_alive()
    assert errors == []
    (stored,) = pilots(db)
    assert (stored.status, stored.submitted_at, stored.last_seen_at) == ("Running", now, later)


def test_another_vos_jobs_do_not_count_as_work_of_the_directors_idle_pilots(
        db: Database, now: datetime) -> None:
    refs = ["gp-1", "gp-2"]
    with db.factory.begin() as s:
        s.add(DirectorQueue(site="LCG.Alpha.org", ce="ce1", queue="long", failures=0,
                            last_error=""))
        record_new_pilots(s, "lhcb", "LCG.Alpha.org", "ce1", "long", "local", refs, now=now)
        for i, ref in enumerate(refs):
            record_submission(s, ref, f"native-{i}", now=now)
        for pilot in s.scalars(select(Pilot)):
            pilot.status, pilot.last_seen_at, pilot.missed_work = "Done", now, True
    with db.factory.begin() as s:
        # A pilot of another VO, under the reference of one of lhcb's, ran a belle job.
        (job_id,) = submit(s, Settings(), now, [requirements(vo="belle",
                                                             owner_group="belle_user")])
        job = s.get(Job, job_id)
        assert job is not None
        job.pilot_reference = "gp-1"
    with db.factory() as s:
        assert idle_pilot_streak(s, "LCG.Alpha.org", "ce1", "long", length=2) == 2


def _failed_starts(db: Database, refs: list[str], now: datetime) -> None:
    """Director's pilots of LCG.Alpha.org/ce1/long that its CE took and that ended, exit
    code 3, without ever reaching the matcher."""
    with db.factory.begin() as s:
        record_new_pilots(s, "lhcb", "LCG.Alpha.org", "ce1", "long", "local", refs, now=now)
        for i, ref in enumerate(refs):
            record_submission(s, ref, f"native-{ref}", now=now)
            assert set_pilot_status(s, reference=ref, status="Failed", reason="exit code 3",
                                    now=now + timedelta(seconds=i + 1))


def test_failed_starts_stop_the_queue_until_a_pilot_reaches_the_matcher_or_a_retry(
        db: Database, now: datetime) -> None:
    key = ("LCG.Alpha.org", "ce1", "long")
    _failed_starts(db, ["fs-1", "fs-2"], now)
    with db.factory.begin() as s:
        assert failed_start_streak(s, *key, length=3) == []  # two in a row only
        state = lock_director_queue(s, *key, now=now)
    # One that was killed by an operator is no failed start; the third that dies is.
    _failed_starts(db, ["fs-k"], now + timedelta(seconds=10))
    with db.factory.begin() as s:
        killed = s.scalars(select(Pilot).where(Pilot.reference == "fs-k")).one()
        killed.kill_requested_by = "olga"
    _failed_starts(db, ["fs-3"], now + timedelta(seconds=20))
    at = now + timedelta(seconds=30)
    with db.factory.begin() as s:
        dead = failed_start_streak(s, *key, length=3)
        assert [p.reference for p in dead] == ["fs-3", "fs-2", "fs-1"]
        state = lock_director_queue(s, *key, now=at)
        reason = stop_for_failed_starts(s, state, dead, now=at)
        assert reason.startswith("the last 3 pilots ended before they reached the matcher "
                                 "(last, fs-3: exit code 3)")
        assert starts_stopped(s, state) == reason
        # The pilots that ended before the stop do not stop the queue again.
        assert failed_start_streak(s, *key, length=3) == []
    # A pilot of the queue (one still alive at the stop) reaches the matcher: lifted.
    with db.factory.begin() as s:
        record_new_pilots(s, "lhcb", *key, "local", ["alive"], now=now)
        register_pilot(s, "lhcb", PilotInfo("alive", *key, "Running"),
                       now=at + timedelta(seconds=5))
    with db.factory.begin() as s:
        state = lock_director_queue(s, *key, now=at)
        assert starts_stopped(s, state) == ""
        assert (state.failed_starts, state.starts_error) == (0, "")
    # Stopped again later; an operator's retry lifts it, and only pilots that end after it
    # count towards the next stop.
    _failed_starts(db, ["fs-4", "fs-5", "fs-6"], at + timedelta(seconds=10))
    later = at + timedelta(seconds=60)
    with db.factory.begin() as s:
        state = lock_director_queue(s, *key, now=later)
        stop_for_failed_starts(s, state, failed_start_streak(s, *key, length=3), now=later)
        assert starts_stopped(s, state)
        retry_queue(s, *key, by="olga", now=later + timedelta(seconds=1))
        assert starts_stopped(s, state) == ""
        assert failed_start_streak(s, *key, length=3) == []


def _held_by(db: Database, holders: dict[int, str]) -> None:
    with db.factory.begin() as s:
        for job_id, reference in holders.items():
            s.execute(update(Job).where(Job.id == job_id).values(pilot_reference=reference))


def test_a_pilots_runs_are_the_jobs_it_holds_and_those_it_started_newest_first(
        db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements() for _ in range(6)])
        (theirs,) = submit(s, settings, now, [requirements(vo="belle")])
    a, b, c, d, e, f = ids
    _held_by(db, {a: "p-1", b: "p-1", c: "p-2", d: "p-1", e: "p-2", theirs: "p-1"})
    with db.factory.begin() as s:
        record_run(s, "lhcb", "p-1", c, now=now)  # rescheduled to p-2 since
        record_run(s, "lhcb", "p-1", d, now=now)  # still held: listed once
        record_run(s, "lhcb", "p-2", f, now=now)
    with db.factory() as s:
        assert [j.id for j in runs_of_pilot(s, "lhcb", "p-1")] == [d, c, b, a]
        assert [j.id for j in runs_of_pilot(s, "lhcb", "p-1", limit=3)] == [d, c, b]
        assert [j.id for j in runs_of_pilot(s, "lhcb", "p-1", limit=1)] == [d]
        assert [j.id for j in runs_of_pilot(s, "lhcb", "p-2")] == [f, e, c]
        assert [j.id for j in runs_of_pilot(s, "belle", "p-1")] == [theirs]
        assert runs_of_pilot(s, "lhcb", "p-3") == []


def test_a_pilots_last_report_is_its_newest_change_on_a_job_it_holds(
        db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        a, b, c = submit(s, settings, now, [requirements() for _ in range(3)])
    _held_by(db, {a: "p-1", b: "p-1", c: "p-2"})
    with db.factory.begin() as s:
        assert last_pilot_report(s, "lhcb", "p-1") is None
        for job_id, status, source in ((b, "Running", "pilot"), (a, "Running", "pilot"),
                                       (a, "Stalled", "watchdog"), (c, "Done", "pilot")):
            s.execute(insert(history_table).values(job_id=job_id, at=now, status=status,
                                                   minor_status="", source=source))
    with db.factory() as s:
        report = last_pilot_report(s, "lhcb", "p-1")
        assert report is not None and (report.job_id, report.status) == (a, "Running")
        other = last_pilot_report(s, "lhcb", "p-2")
        assert other is not None and (other.job_id, other.status) == (c, "Done")
        assert last_pilot_report(s, "belle", "p-1") is None
