"""A killed pilot gets nothing more, on every claim path (the PostgreSQL function, the MariaDB
procedure, the Python path); a pilot heard from after its record ended is noted once; a report
on a job that is no longer the pilot's changes nothing."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

import pytest

from taskqueue.core.errors import ForbiddenError
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db.models import Job, Pilot
from taskqueue.pilots.pilotlogs import record_ce_state, request_kill
from taskqueue.pilots.pilotmatch import MatchDatabase, match_for_pilot
from taskqueue.pilots.pilotreports import StatusReport, report_status
from taskqueue.pilots.records import PilotInfo, register_pilot
from taskqueue.queues.jobs import job_history
from tests.conftest import Database
from tests.helpers import requirements, submit

S = JobStatus
SITE = "LCG.Alpha.org"


def paths(db: Database) -> list[MatchDatabase]:
    """The database's claim function (where it has one) and the Python path."""
    return [db.matches, MatchDatabase(db.factory)]


def pilot(db: Database, reference: str, now: datetime) -> None:
    with db.factory.begin() as s:
        register_pilot(s, "lhcb", PilotInfo(reference, SITE, "ce1", "q", "Running"), now=now)


def ask(matches: MatchDatabase, reference: str, now: datetime) -> tuple[list[int], str | None]:
    answer = match_for_pilot(matches, parse_resource(
        {"vo": "lhcb", "site": SITE, "pilot_reference": reference}), now=now)
    return [j.id for j in answer.jobs], answer.reason


def status(db: Database, job_id: int) -> tuple[str, int, str | None]:
    with db.factory() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.status, job.reschedule_count, job.pilot_reference


def test_a_killed_pilot_claims_nothing_on_any_path(db: Database, settings: Settings,
                                                   now: datetime) -> None:
    with db.factory.begin() as s:
        (job_id,) = submit(s, settings, now, [requirements()])
    pilot(db, "p-killed", now)
    with db.factory.begin() as s:
        request_kill(s, "lhcb", "p-killed", by="olga", now=now)
    for matches in paths(db):
        assert ask(matches, "p-killed", now) == ([], "pilot_killed")
        assert status(db, job_id) == ("Waiting", 0, None)
    # Another pilot, known or not, still gets the job.
    assert ask(db.matches, "p-other", now)[0] == [job_id]


@pytest.mark.parametrize("ended", ["Done", "Aborted", "Lost"])
def test_a_pilot_heard_from_after_its_end_is_noted_once_and_gets_nothing(
        db: Database, settings: Settings, now: datetime, ended: str) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements()])
    pilot(db, "p-ended", now)
    with db.factory.begin() as s:
        record_ce_state(s, "lhcb", "p-ended", status=ended, reason="", exit_code=None,
                        now=now)
    for i, matches in enumerate(paths(db)):
        assert ask(matches, "p-ended", now + timedelta(seconds=i + 1)) == ([], "pilot_killed")
    with db.factory() as s:
        record = s.query(Pilot).filter_by(reference="p-ended").one()
        assert record.heard_after_end_at == now + timedelta(seconds=1)  # the first time only


def test_a_report_on_a_job_no_longer_the_pilots_changes_nothing(
        db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        (job_id,) = submit(s, settings, now, [requirements()])
    pilot(db, "p-1", now)
    assert ask(db.matches, "p-1", now)[0] == [job_id]

    def say(status: JobStatus, **fields: object) -> JobStatus:
        with db.factory.begin() as s:
            return report_status(s, job_id, StatusReport(status, **fields),  # type: ignore[arg-type]
                                 vo="lhcb", pilot_reference="p-1", now=now,
                                 max_reschedules=3)

    assert say(S.RUNNING) == S.RUNNING
    assert say(S.RESCHEDULED, minor_status="Pilot stopped: killed") == S.RECEIVED
    before = status(db, job_id)
    with db.factory() as s:
        history = [(h.status, h.minor_status) for h in job_history(s, job_id)]
    assert before == ("Received", 1, None)
    for late in (S.RESCHEDULED, S.FAILED, S.DONE, S.RUNNING):
        with pytest.raises(ForbiddenError, match="was not given to pilot"):
            say(late, exit_code=1, output_tail="late", cpu_used=5.0)
    assert status(db, job_id) == before
    with db.factory() as s:
        assert [(h.status, h.minor_status) for h in job_history(s, job_id)] == history
        job = s.get(Job, job_id)
        assert job is not None and (job.exit_code, job.output_tail, job.cpu_used) == (
            None, None, None)


def test_a_kill_racing_claims_loses_no_job_and_counts_none(
        db: Database, settings: Settings, now: datetime) -> None:
    """Matchers claim for one pilot in threads while its kill lands: each job ends either
    never handed out or handed back by its confirmation, Waiting with no attempt counted;
    no job is claimed twice; after the kill no claim succeeds."""
    with db.factory.begin() as s:
        job_ids = submit(s, settings, now, [requirements()] * 24)
    pilot(db, "p-race", now)
    claimed: list[int] = []
    refused: list[str | None] = []
    lock = threading.Lock()
    killed = threading.Event()

    def claim() -> None:
        for _ in range(6):
            got, reason = ask(db.matches, "p-race", now)
            with lock:
                claimed.extend(got)
                if not got:
                    refused.append(reason)
            if len(claimed) >= 4 and not killed.is_set():
                killed.set()
                with db.factory.begin() as s:
                    request_kill(s, "lhcb", "p-race", by="olga", now=now)

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert killed.is_set()
    assert len(claimed) == len(set(claimed)), "a job was claimed twice"
    assert set(refused) <= {"pilot_killed"}
    assert ask(db.matches, "p-race", now) == ([], "pilot_killed")
    # The pilot confirms what it got: each goes back, uncounted.
    for job_id in claimed:
        with db.factory.begin() as s:
            assert report_status(s, job_id, StatusReport(S.RUNNING), vo="lhcb",
                                 pilot_reference="p-race", now=now,
                                 max_reschedules=3) != S.RUNNING
    for job_id in job_ids:
        state, count, holder = status(db, job_id)
        assert (count, holder) == (0, None), (job_id, state, count, holder)
        assert state in ("Waiting", "Received"), (job_id, state)
    assert ask(db.matches, "p-other", now)[0], "the jobs are there for another pilot"
