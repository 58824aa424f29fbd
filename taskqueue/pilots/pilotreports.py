"""What pilots tell the central service about the jobs they were given: heartbeats and status
reports, and the commands they get back.

A pilot speaks only of jobs matched to it: a job whose ``pilot_reference`` is another's is
refused (status reports) or answered with "kill" (heartbeats: the job was taken from this pilot
and given to another, or killed, deleted or rescheduled). Reports are idempotent, so a pilot
that lost an answer can send the same report again and get the same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Float, String, Text, bindparam, func, select, update
from sqlalchemy.orm import Session

from taskqueue.core.errors import ForbiddenError, IllegalTransitionError, NotFoundError
from taskqueue.core.states import FINAL_STATES, JobStatus
from taskqueue.db.models import Job, Pilot, jobs_table
from taskqueue.pilots.records import STOP_PILOT, pilot_stop_reason, record_run
from taskqueue.queues.jobcontrol import lock_job, reschedule_job
from taskqueue.queues.jobs import apply_transition, record_minor_status

S = JobStatus

#: Statuses in which a job belongs to its pilot.
ACTIVE_STATES: frozenset[JobStatus] = frozenset({S.MATCHED, S.RUNNING, S.STALLED,
                                                 S.COMPLETING})
#: Statuses a pilot may report.
REPORTABLE: frozenset[JobStatus] = frozenset({S.RUNNING, S.COMPLETING, S.DONE, S.FAILED,
                                              S.RESCHEDULED})
KILL = "kill"
#: Bytes of a payload's output tail kept.
OUTPUT_TAIL_BYTES = 16 * 1024

_BEAT = (
    update(jobs_table)
    .where(jobs_table.c.id == bindparam("b_id"))
    # A beat without CPU time or progress keeps what the last one said.
    .values(heartbeat_at=bindparam("b_at"),
            cpu_used=func.coalesce(bindparam("b_cpu", type_=Float()), jobs_table.c.cpu_used),
            progress=func.coalesce(bindparam("b_progress", type_=String()),
                                   jobs_table.c.progress),
            output_tail=func.coalesce(bindparam("b_tail", type_=Text()),
                                      jobs_table.c.output_tail))
)


@dataclass(frozen=True)
class Beat:
    """One job's heartbeat: CPU seconds used so far, free-text progress, and the tail of its
    output so far (kept as the job's output tail until its final report replaces it)."""

    job_id: int
    cpu_used: float | None = None
    progress: str | None = None
    output_tail: str | None = None


def heartbeat(session: Session, *, vo: str, pilot_reference: str, beats: Sequence[Beat],
              now: datetime, source: str = "pilot") -> dict[int, str]:
    """Record the pilot's heartbeats; return the commands for it, job id → command.

    A Stalled job that beats again resumes Running.
    """
    pilot_reference = pilot_reference.strip()
    commands: dict[int, str] = {}
    if not beats:
        _touch_pilot(session, vo, pilot_reference, now)
        return commands
    ids = sorted({b.job_id for b in beats})
    rows = {row.id: row for row in session.execute(
        select(Job.id, Job.vo, Job.status, Job.pilot_reference)
        .where(Job.id.in_(ids)).order_by(Job.id).with_for_update())}
    live: list[Beat] = []
    stalled: list[int] = []
    for beat in beats:
        row = rows.get(beat.job_id)
        if (row is None or row.vo != vo or row.pilot_reference != pilot_reference
                or JobStatus(row.status) not in ACTIVE_STATES):
            commands[beat.job_id] = KILL
            continue
        live.append(beat)
        if row.status == S.STALLED and beat.job_id not in stalled:
            stalled.append(beat.job_id)
    if stalled:
        apply_transition(session, stalled, S.STALLED, S.RUNNING,
                         minor_status="Heartbeat after stall", source=source, now=now)
    if live:
        session.connection().execute(_BEAT, [
            {"b_id": b.job_id, "b_at": now, "b_cpu": b.cpu_used,
             "b_progress": (b.progress or None) and b.progress[:255],
             "b_tail": b.output_tail} for b in live])
    _touch_pilot(session, vo, pilot_reference, now)
    return commands


@dataclass(frozen=True)
class StatusReport:
    status: JobStatus
    minor_status: str = ""
    exit_code: int | None = None
    output_tail: str | None = None
    cpu_used: float | None = None


def report_status(session: Session, job_id: int, report: StatusReport, *, vo: str,
                  pilot_reference: str, now: datetime, max_reschedules: int,
                  source: str = "pilot") -> JobStatus:
    """Apply a pilot's report on one of its jobs; return the job's status afterwards.

    Running (the payload started), Completing, Done or Failed (it ended, with its exit code
    and output tail), Rescheduled (the pilot must stop before the job ends: it goes back to
    the optimizer chain, or fails once it has been rescheduled too often). A report on a job
    that was killed or deleted meanwhile keeps its output and leaves its status alone; a
    report repeating the job's status is accepted again.
    """
    if report.status not in REPORTABLE:
        raise IllegalTransitionError(
            f"a pilot may report {', '.join(sorted(REPORTABLE))}, not {report.status}")
    job = lock_job(session, job_id)
    if job.vo != vo:  # another VO's job: as if it did not exist
        raise NotFoundError(f"job {job_id} does not exist")
    if job.pilot_reference != pilot_reference.strip():
        raise ForbiddenError(f"job {job_id} was not given to pilot {pilot_reference!r}")
    current = JobStatus(job.status)
    ended = report.status in (S.DONE, S.FAILED)
    values: dict[str, object] = {}
    if report.cpu_used is not None:
        values["cpu_used"] = report.cpu_used
    if ended:
        values["exit_code"] = report.exit_code
        if report.output_tail is not None:
            values["output_tail"] = _tail(report.output_tail)
    if current == report.status or current in FINAL_STATES:
        # A repeated report, or a job that ended otherwise meanwhile (killed, deleted):
        # keep what the pilot says about its output, but the status stands.
        for key, value in values.items():
            setattr(job, key, value)
        minor = (report.minor_status or _default_minor(report))[:255]
        if current == report.status == S.RUNNING and job.minor_status != minor:
            # Running again once the payload starts, after Running while the pilot fetched
            # the input sandboxes: the new step is recorded.
            job.minor_status = minor
            job.heartbeat_at = now
            session.flush()
            record_minor_status(session, [job_id], current, minor, source=source, now=now)
        session.flush()
        return current
    if current not in ACTIVE_STATES:
        raise IllegalTransitionError(
            f"job {job_id} is {current}, no longer running on pilot {pilot_reference!r}")
    if current == S.MATCHED:
        stop = pilot_stop_reason(session, vo, job.pilot_reference or "", now=now)
        if stop is not None:
            # Claimed while a kill landed: the job goes back without counting an attempt
            # (its payload, if started, is stopped on the pilot's next heartbeat).
            return reschedule_job(session, job_id, by=source, now=now,
                                  reason=f"Not started: {stop}", count=False,
                                  max_reschedules=max_reschedules, fail_when_exhausted=True)
        if report.status != S.RESCHEDULED:
            record_run(session, vo, job.pilot_reference or "", job_id, now=now)
    if report.status == S.RESCHEDULED:
        return reschedule_job(session, job_id, by=source, now=now,
                              reason=report.minor_status or "Rescheduled by its pilot",
                              max_reschedules=max_reschedules, fail_when_exhausted=True)
    if report.status == S.RUNNING and job.started_at is None:
        values["started_at"] = now
    if ended:
        values["ended_at"] = now
    values["heartbeat_at"] = now
    minor = report.minor_status or _default_minor(report)
    apply_transition(session, [job_id], current, report.status, minor_status=minor[:255],
                     source=source, now=now, values=values)
    return report.status


def _default_minor(report: StatusReport) -> str:
    if report.status == S.RUNNING:
        return "Application started"
    if report.status in (S.DONE, S.FAILED) and report.exit_code is not None:
        return f"Application exited with code {report.exit_code}"
    return f"Reported {report.status} by its pilot"


def _tail(text: str) -> str:
    data = text.encode("utf-8", errors="replace")
    if len(data) <= OUTPUT_TAIL_BYTES:
        return text
    return data[-OUTPUT_TAIL_BYTES:].decode("utf-8", errors="ignore")


def pilot_command(session: Session, *, vo: str, pilot_reference: str,
                  now: datetime) -> str | None:
    """The command for the pilot as a whole that its heartbeat answer carries: STOP_PILOT
    when it must stop (taskqueue.pilots.records.pilot_stop_reason), else None."""
    stop = pilot_stop_reason(session, vo, pilot_reference.strip(), now=now)
    return None if stop is None else STOP_PILOT


def _touch_pilot(session: Session, vo: str, reference: str, now: datetime) -> None:
    session.execute(update(Pilot).where(Pilot.reference == reference, Pilot.vo == vo)
                    .values(last_seen_at=now))
