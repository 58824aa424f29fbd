"""What pilots report on their jobs: heartbeats (and the kill commands they get back) and
status reports."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import select

from taskqueue.core.errors import ForbiddenError, IllegalTransitionError, NotFoundError
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db.models import Job, Pilot
from taskqueue.pilots.pilotreports import (
    KILL,
    OUTPUT_TAIL_BYTES,
    Beat,
    StatusReport,
    heartbeat,
    report_status,
)
from taskqueue.pilots.records import PilotInfo, register_pilot
from taskqueue.queues.jobcontrol import kill_job, reschedule_job
from taskqueue.queues.jobs import apply_transition, job_history
from tests.conftest import Database
from tests.helpers import claim, requirements, submit

S = JobStatus
PILOT = "pilot-1"
SITE = "LCG.Alpha.org"


def stored(db: Database, job_id: int) -> Job:
    with db.factory() as s:
        job = s.get(Job, job_id)
    assert job is not None
    return job


def matched_jobs(db: Database, settings: Settings, now: datetime, n: int = 1,
                 pilot: str = PILOT, vo: str = "lhcb") -> list[int]:
    """``n`` jobs Matched to ``pilot``."""
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements(vo=vo, owner=f"{pilot}-owner")] * n)
        claims = claim(s, now, count=n, vo=vo, pilot_reference=pilot, site=SITE,
                       owner=f"{pilot}-owner")
    assert sorted(c.job_id for c in claims) == sorted(ids)
    return ids


def report(db: Database, job_id: int, status: JobStatus, now: datetime, *,
           pilot: str = PILOT, vo: str = "lhcb", max_reschedules: int = 3,
           **fields: object) -> JobStatus:
    with db.factory.begin() as s:
        return report_status(s, job_id, StatusReport(status, **fields),  # type: ignore[arg-type]
                             vo=vo, pilot_reference=pilot, now=now,
                             max_reschedules=max_reschedules)


def beat(db: Database, beats: list[Beat], now: datetime, *, pilot: str = PILOT,
         vo: str = "lhcb") -> dict[int, str]:
    with db.factory.begin() as s:
        return heartbeat(s, vo=vo, pilot_reference=pilot, beats=beats, now=now)


# -- heartbeats -----------------------------------------------------------------------------

def test_heartbeat_records_progress(db: Database, settings: Settings, now: datetime) -> None:
    a, b = matched_jobs(db, settings, now, 2)
    report(db, a, S.RUNNING, now)
    later = now + timedelta(minutes=10)
    commands = beat(db, [Beat(a, cpu_used=120.5, progress="event 300/1000"), Beat(b)], later)
    assert commands == {}
    job_a, job_b = stored(db, a), stored(db, b)
    assert (job_a.status, job_a.heartbeat_at, job_a.cpu_used, job_a.progress) == (
        "Running", later, 120.5, "event 300/1000")
    assert (job_b.status, job_b.heartbeat_at) == ("Matched", later)


def test_heartbeat_carries_the_output_tail_until_the_final_report(
        db: Database, settings: Settings, now: datetime) -> None:
    """A peek at a running job: each heartbeat's tail replaces the last; a beat without one
    keeps it; the final report's tail replaces it for good, and a late beat leaves that."""
    (job_id,) = matched_jobs(db, settings, now)
    report(db, job_id, S.RUNNING, now)
    beat(db, [Beat(job_id, output_tail="event 1\n")], now + timedelta(minutes=5))
    assert stored(db, job_id).output_tail == "event 1\n"
    beat(db, [Beat(job_id, output_tail="event 1\nevent 2\n")], now + timedelta(minutes=10))
    beat(db, [Beat(job_id, cpu_used=12.0)], now + timedelta(minutes=15))
    assert stored(db, job_id).output_tail == "event 1\nevent 2\n"
    report(db, job_id, S.DONE, now + timedelta(minutes=20), exit_code=0,
           output_tail="the end\n")
    assert beat(db, [Beat(job_id, output_tail="late\n")], now + timedelta(minutes=21)) == {
        job_id: "kill"}
    assert stored(db, job_id).output_tail == "the end\n"


def test_heartbeat_cuts_long_progress(db: Database, settings: Settings, now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    assert beat(db, [Beat(job_id, progress="x" * 300)], now) == {}
    assert stored(db, job_id).progress == "x" * 255


def test_heartbeat_answers_kill_for_jobs_no_longer_the_pilots(db: Database, settings: Settings,
                                                              now: datetime) -> None:
    mine, killed = matched_jobs(db, settings, now, 2)
    (theirs,) = matched_jobs(db, settings, now, pilot="pilot-2")
    (belle,) = matched_jobs(db, settings, now, pilot=PILOT, vo="belle")
    with db.factory.begin() as s:
        kill_job(s, killed, by="alice", now=now)
    later = now + timedelta(minutes=1)
    commands = beat(db, [Beat(mine, cpu_used=1.0), Beat(killed, cpu_used=2.0),
                         Beat(theirs, cpu_used=3.0), Beat(belle, cpu_used=4.0),
                         Beat(987654, cpu_used=5.0)], later)
    assert commands == {killed: KILL, theirs: KILL, belle: KILL, 987654: KILL}
    assert stored(db, mine).heartbeat_at == later
    for other in (killed, theirs, belle):  # nothing recorded on jobs the pilot does not hold
        job = stored(db, other)
        assert job.heartbeat_at == now and job.cpu_used is None
    assert stored(db, killed).status == "Killed"


def test_heartbeat_answers_kill_for_a_rescheduled_job(db: Database, settings: Settings,
                                                      now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    with db.factory.begin() as s:
        reschedule_job(s, job_id, by="watchdog", now=now, reason="Stalled", max_reschedules=3,
                       fail_when_exhausted=True)
    assert beat(db, [Beat(job_id)], now) == {job_id: KILL}
    assert stored(db, job_id).status == "Received"


def test_stalled_job_that_beats_resumes_running(db: Database, settings: Settings,
                                                now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    report(db, job_id, S.RUNNING, now)
    with db.factory.begin() as s:
        apply_transition(s, [job_id], S.RUNNING, S.STALLED, minor_status="No heartbeat",
                         source="watchdog", now=now)
    later = now + timedelta(hours=1)
    assert beat(db, [Beat(job_id, cpu_used=7.0)], later) == {}
    job = stored(db, job_id)
    assert (job.status, job.heartbeat_at, job.cpu_used) == ("Running", later, 7.0)
    with db.factory() as s:
        history = [(h.status, h.minor_status) for h in job_history(s, job_id)]
    assert history[-2:] == [("Stalled", "No heartbeat"), ("Running", "Heartbeat after stall")]


def test_stalled_job_beating_twice_in_one_call(db: Database, settings: Settings,
                                               now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    with db.factory.begin() as s:
        apply_transition(s, [job_id], S.MATCHED, S.STALLED, minor_status="No heartbeat",
                         source="watchdog", now=now)
    later = now + timedelta(minutes=1)
    assert beat(db, [Beat(job_id, cpu_used=1.0), Beat(job_id, cpu_used=2.0)], later) == {}
    job = stored(db, job_id)
    assert job.status == "Running" and job.heartbeat_at == later


def test_heartbeat_touches_the_pilot(db: Database, settings: Settings, now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    with db.factory.begin() as s:
        register_pilot(s, "lhcb", PilotInfo(PILOT, SITE, "ce1", "q1", "Running"), now=now)
        register_pilot(s, "lhcb", PilotInfo("pilot-2", SITE, "ce1", "q1", "Running"), now=now)
    later = now + timedelta(minutes=2)
    beat(db, [Beat(job_id)], later)
    even_later = later + timedelta(minutes=2)
    beat(db, [], even_later)  # an empty heartbeat still says the pilot is alive
    with db.factory() as s:
        seen = {p.reference: p.last_seen_at for p in s.scalars(select(Pilot))}
    assert seen == {PILOT: even_later, "pilot-2": now}


# -- status reports -------------------------------------------------------------------------

def test_running_report_sets_started_at(db: Database, settings: Settings,
                                        now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    later = now + timedelta(seconds=30)
    assert report(db, job_id, S.RUNNING, later, cpu_used=0.5) is S.RUNNING
    job = stored(db, job_id)
    assert (job.status, job.minor_status, job.started_at, job.heartbeat_at, job.cpu_used) == (
        "Running", "Application started", later, later, 0.5)
    # a repeated Running report is accepted and keeps the start time
    assert report(db, job_id, S.RUNNING, later + timedelta(minutes=1)) is S.RUNNING
    assert stored(db, job_id).started_at == later


@pytest.mark.parametrize("final", [S.DONE, S.FAILED])
def test_end_report_stores_the_result(db: Database, settings: Settings, now: datetime,
                                      final: JobStatus) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    report(db, job_id, S.RUNNING, now)
    end = now + timedelta(hours=2)
    code = 0 if final is S.DONE else 2
    assert report(db, job_id, final, end, exit_code=code, output_tail="last lines\n",
                  cpu_used=7000.0) is final
    job = stored(db, job_id)
    assert (job.status, job.exit_code, job.output_tail, job.ended_at, job.cpu_used,
            job.started_at) == (final.value, code, "last lines\n", end, 7000.0, now)
    assert job.minor_status == f"Application exited with code {code}"


def test_end_report_with_its_own_minor_status(db: Database, settings: Settings,
                                              now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    report(db, job_id, S.FAILED, now, exit_code=137, minor_status="Out of memory")
    job = stored(db, job_id)
    assert (job.status, job.minor_status, job.exit_code) == ("Failed", "Out of memory", 137)


def test_repeated_done_report_is_idempotent(db: Database, settings: Settings,
                                            now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    report(db, job_id, S.RUNNING, now)
    end = now + timedelta(hours=1)
    assert report(db, job_id, S.DONE, end, exit_code=0, output_tail="ok") is S.DONE
    again = end + timedelta(minutes=1)
    assert report(db, job_id, S.DONE, again, exit_code=0, output_tail="ok") is S.DONE
    job = stored(db, job_id)
    assert (job.status, job.exit_code, job.output_tail, job.ended_at) == ("Done", 0, "ok", end)
    with db.factory() as s:
        assert [h.status for h in job_history(s, job_id)].count("Done") == 1


def test_done_on_a_killed_job_keeps_killed_but_stores_the_output(
        db: Database, settings: Settings, now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    report(db, job_id, S.RUNNING, now)
    with db.factory.begin() as s:
        kill_job(s, job_id, by="alice", now=now)
    later = now + timedelta(minutes=1)
    assert report(db, job_id, S.DONE, later, exit_code=143, output_tail="SIGTERM") is S.KILLED
    job = stored(db, job_id)
    assert (job.status, job.exit_code, job.output_tail, job.ended_at) == (
        "Killed", 143, "SIGTERM", now)
    with db.factory() as s:
        assert "Done" not in [h.status for h in job_history(s, job_id)]


def test_report_by_another_pilot_is_forbidden(db: Database, settings: Settings,
                                              now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    with pytest.raises(ForbiddenError):
        report(db, job_id, S.DONE, now, pilot="pilot-2", exit_code=0, output_tail="mine")
    with pytest.raises(NotFoundError):  # another VO's job: as if it did not exist
        report(db, job_id, S.RUNNING, now, vo="belle")
    job = stored(db, job_id)
    assert (job.status, job.exit_code, job.output_tail) == ("Matched", None, None)


def test_report_refusals(db: Database, settings: Settings, now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    for status in (S.MATCHED, S.KILLED, S.WAITING, S.DELETED):
        with pytest.raises(IllegalTransitionError):
            report(db, job_id, status, now)
    with pytest.raises(NotFoundError):
        report(db, 987654, S.RUNNING, now)
    assert stored(db, job_id).status == "Matched"


def test_rescheduled_report_sends_the_job_back(db: Database, settings: Settings,
                                               now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    report(db, job_id, S.RUNNING, now)
    assert report(db, job_id, S.RESCHEDULED, now, minor_status="Out of time") is S.RECEIVED
    job = stored(db, job_id)
    assert (job.status, job.reschedule_count, job.pilot_reference, job.site) == (
        "Received", 1, None, None)
    with db.factory() as s:
        history = [(h.status, h.minor_status, h.source) for h in job_history(s, job_id)]
    assert history[-2:] == [("Rescheduled", "Out of time", "pilot"),
                            ("Received", "Job rescheduled", "pilot")]


def test_rescheduled_report_past_the_maximum_fails_the_job(db: Database, settings: Settings,
                                                           now: datetime) -> None:
    (job_id,) = matched_jobs(db, settings, now)
    report(db, job_id, S.RUNNING, now)
    assert report(db, job_id, S.RESCHEDULED, now, max_reschedules=0,
                  minor_status="Out of time") is S.FAILED
    job = stored(db, job_id)
    assert job.status == "Failed" and job.ended_at == now
    assert "Out of time" in job.minor_status and "maximum" in job.minor_status


def test_output_tail_keeps_only_the_end(db: Database, settings: Settings,
                                        now: datetime) -> None:
    a, b, c = matched_jobs(db, settings, now, 3)
    long_text = "".join(f"line {i}\n" for i in range(10_000))
    assert len(long_text.encode()) > OUTPUT_TAIL_BYTES
    report(db, a, S.DONE, now, exit_code=0, output_tail=long_text)
    assert stored(db, a).output_tail == long_text[-OUTPUT_TAIL_BYTES:]
    # multi-byte characters: at most OUTPUT_TAIL_BYTES bytes, never half a character
    wide = "é" * OUTPUT_TAIL_BYTES + "end"
    report(db, b, S.FAILED, now, exit_code=1, output_tail=wide)
    kept = stored(db, b).output_tail
    assert kept is not None and wide.endswith(kept) and kept.endswith("end")
    assert OUTPUT_TAIL_BYTES - 2 <= len(kept.encode()) <= OUTPUT_TAIL_BYTES
    exact = "x" * OUTPUT_TAIL_BYTES
    report(db, c, S.DONE, now, exit_code=0, output_tail=exact)
    assert stored(db, c).output_tail == exact
