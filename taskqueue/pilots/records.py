"""The pilot registry: which pilots exist, where, in what state, and when they last spoke;
and the site director's per-queue state."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from taskqueue.core.errors import ForbiddenError, InvalidInputError, NotFoundError
from taskqueue.db.models import DirectorQueue, Job, JobStatusHistory, Pilot, PilotRun

#: The states of a pilot's life, in order, as the site director, its batch system and the
#: pilot itself report them. Submitting: decided by a director, not yet accepted by the batch
#: system. Lost: vanished from the batch system without saying it ended.
PILOT_STATES: tuple[str, ...] = ("Submitting", "Submitted", "Waiting", "Running", "Done",
                                 "Failed", "Aborted", "Lost")
WAITING_STATES: tuple[str, ...] = ("Submitting", "Submitted", "Waiting")
ALIVE_STATES: tuple[str, ...] = (*WAITING_STATES, "Running")
FINAL_PILOT_STATES: frozenset[str] = frozenset({"Done", "Failed", "Aborted", "Lost"})


@dataclass(frozen=True)
class PilotInfo:
    reference: str
    site: str
    ce: str
    queue: str
    status: str
    #: How it isolates its payloads ("bwrap 0.8.0", "none"); None: not said.
    isolation: str | None = None


def register_pilot(session: Session, vo: str, info: PilotInfo, *, now: datetime) -> Pilot:
    """Create the pilot's record, or bring it up to date (same reference, same VO).

    References are unique per VO: another VO's pilot of the same reference is another pilot,
    which this neither sees nor changes."""
    if not info.reference.strip():
        raise InvalidInputError("a pilot reference must not be empty")
    if info.status not in PILOT_STATES:
        raise InvalidInputError(
            f"pilot status must be one of {', '.join(PILOT_STATES)}, got {info.status!r}")
    pilot = _locked(session, vo, info.reference)
    if pilot is None:
        try:
            with session.begin_nested():
                pilot = Pilot(reference=info.reference, vo=vo, site=info.site, ce=info.ce,
                              queue=info.queue, status=info.status, submitted_at=now,
                              last_seen_at=now, isolation=info.isolation)
                session.add(pilot)
            return pilot
        except IntegrityError:  # registered by a concurrent call: update that record
            pilot = _locked(session, vo, info.reference)
            assert pilot is not None
    pilot.site, pilot.ce, pilot.queue = info.site, info.ce, info.queue
    if info.isolation is not None:
        pilot.isolation = info.isolation
    if may_move(pilot.status, info.status):
        pilot.status, pilot.updated_at = info.status, now
    pilot.last_seen_at = now
    session.flush()
    return pilot


def may_move(current: str, new: str) -> bool:
    """A pilot's status only moves forward: a late batch-system poll saying Running does not
    undo the pilot's own Done. Among the final states the first one stands."""
    if current in FINAL_PILOT_STATES:
        return False
    return PILOT_STATES.index(new) >= PILOT_STATES.index(current)


def set_pilot_status(session: Session, *, reference: str, status: str, now: datetime,
                     reason: str = "") -> bool:
    """Move a pilot forward to ``status``; returns whether it moved. Where two VOs hold the
    reference, the site director's record (it has an executor) is the one meant."""
    pilot = session.scalars(select(Pilot).where(Pilot.reference == reference)
                            .order_by(Pilot.executor.is_(None), Pilot.id)
                            .with_for_update()).first()
    if pilot is None or not may_move(pilot.status, status):
        return False
    pilot.status, pilot.updated_at = status, now
    if reason:
        pilot.reason = reason[:255]
    session.flush()
    return True


def lock_director_queue(session: Session, site: str, ce: str, queue: str, *,
                        now: datetime) -> DirectorQueue:
    """The director's row for a queue, created if new, locked for this transaction."""
    key = (site, ce, queue)
    row = session.get(DirectorQueue, key, with_for_update=True)
    if row is None:
        try:
            with session.begin_nested():
                session.add(DirectorQueue(site=site, ce=ce, queue=queue, failures=0,
                                          last_error=""))
        except IntegrityError:
            pass  # created by a concurrent director: lock that one
        row = session.get(DirectorQueue, key, with_for_update=True, populate_existing=True)
        assert row is not None
    row.last_cycle_at = now
    return row


def count_pilots(session: Session, site: str, ce: str, queue: str) -> dict[str, int]:
    """The queue's pilots that are not final, by status."""
    return {status: n for status, n in session.execute(
        select(Pilot.status, func.count()).where(
            Pilot.site == site, Pilot.ce == ce, Pilot.queue == queue,
            Pilot.status.in_(ALIVE_STATES)).group_by(Pilot.status))}


def count_starting(session: Session, site: str, ce: str, queue: str) -> int:
    """The queue's pilots its CE says run that have not reached the matcher yet: they have
    taken no job, and will ask for one (or die at start)."""
    return session.scalar(select(func.count()).select_from(Pilot).where(
        Pilot.site == site, Pilot.ce == ce, Pilot.queue == queue, Pilot.status == "Running",
        Pilot.last_seen_at.is_(None))) or 0


def record_new_pilots(session: Session, vo: str, site: str, ce: str, queue: str,
                      executor: str, references: list[str], *, now: datetime) -> None:
    for reference in references:
        session.add(Pilot(reference=reference, vo=vo, site=site, ce=ce, queue=queue,
                          status="Submitting", submitted_at=now, executor=executor,
                          reason="", updated_at=now))
    session.flush()


def record_submission(session: Session, reference: str, native_id: str, *,
                      now: datetime) -> None:
    """The batch system took the pilot: note its id; the queue's failure count starts over."""
    pilot = session.scalars(select(Pilot).where(Pilot.reference == reference,
                                                Pilot.executor.is_not(None))
                            .with_for_update()).one()
    pilot.native_id = native_id
    if pilot.status == "Submitting":
        pilot.status, pilot.updated_at = "Submitted", now
    state = session.get(DirectorQueue, (pilot.site, pilot.ce, pilot.queue),
                        with_for_update=True)
    if state is not None and state.failures:
        # skip_until stays: it is in the past, and marks where idle_pilot_streak counts from.
        state.failures = 0
    session.flush()


def record_submission_failure(session: Session, site: str, ce: str, queue: str,
                              references: list[str], *, reason: str, now: datetime,
                              base_backoff: int) -> int:
    """The batch system or CE refused: the pilots decided never reached it, so their records
    go (they would count with the pilots that ran and failed) and the queue counts them as
    unsent; the queue is skipped for ``base_backoff`` seconds, doubling per failure in a row
    (at most 16 times), with the reason kept. Returns the failures in a row."""
    unsent = drop_unsent(session, references)
    state = _back_off(session, site, ce, queue, reason=reason, now=now,
                      base_backoff=base_backoff)
    state.unsent_pilots += unsent
    session.flush()
    return state.failures


def drop_unsent(session: Session, references: list[str]) -> int:
    """Remove the records of pilots a director decided whose submission never reached their
    CE (refused, or left for the next cycle when the CE's turn was over): no CE knows them,
    no pilot runs with them. Only records still Submitting go; returns how many."""
    if not references:
        return 0
    gone = list(session.scalars(select(Pilot).where(Pilot.reference.in_(references),
                                                    Pilot.executor.is_not(None),
                                                    Pilot.status == "Submitting",
                                                    Pilot.native_id.is_(None))
                                .with_for_update()))
    for pilot in gone:
        session.delete(pilot)
    session.flush()
    return len(gone)


_UNSTORABLE = dict.fromkeys([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])


#: What stands for the middle of a text shortened to fit.
ELLIPSIS = " … "


class CELoadCounts(Protocol):
    """What a CE says of one of its queues (agents.ce.base.CELoad)."""

    @property
    def running(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def total(self) -> int: ...
    @property
    def free_slots(self) -> int | None: ...
    @property
    def max_total(self) -> int | None: ...


def record_credential_warning(state: DirectorQueue, warning: str) -> None:
    """Why the queue's CE credential will soon stop working, "" when it will not."""
    stored = storable(warning) if warning else ""
    if state.credential_warning != stored:
        state.credential_warning = stored


def record_ce_load(state: DirectorQueue, load: CELoadCounts | None, *, error: str,
                   read_at: datetime) -> None:
    """What the queue's CE said of its jobs at ``read_at`` (``load``), or why it could not be
    read (``error``: the counts read before are kept, with their time). ``ce_idle_since``
    marks since when every read found waiting jobs and none running."""
    if load is None:
        state.ce_error = storable(error)
        return
    if state.ce_read_at is not None and read_at <= state.ce_read_at:
        return  # that read is stored already
    state.ce_running, state.ce_waiting, state.ce_total = load.running, load.waiting, load.total
    state.ce_free_slots, state.ce_max_total = load.free_slots, load.max_total
    state.ce_read_at, state.ce_error = read_at, ""
    if load.waiting > 0 and load.running == 0:
        state.ce_idle_since = state.ce_idle_since or read_at
    else:
        state.ce_idle_since = None


def storable(text: str, limit: int = 255) -> str:
    """``text`` as a reason or note column takes it on every backend: no NUL or other
    control character (PostgreSQL refuses a NUL), no lone surrogate, at most ``limit``
    characters, shortened in the middle (its beginning names what failed, its end often
    the cause). What a CE or a pilot says is made storable before it is stored."""
    text = text.translate(_UNSTORABLE)
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) <= limit:
        return text
    head = (limit - len(ELLIPSIS)) // 2
    tail = limit - len(ELLIPSIS) - head
    return text[:head] + ELLIPSIS + text[len(text) - tail:]


def record_ce_failure(session: Session, queues: list[tuple[str, str, str]], *, reason: str,
                      now: datetime, base_backoff: int) -> None:
    """A CE did not answer about its pilots: each of its queues (site, CE, queue) counts a
    failed poll, apart from its failed submissions, and is skipped for ``base_backoff``
    seconds, doubling per failed poll in a row (at most 16 times), or until a poll succeeds
    (:func:`record_ce_answered`)."""
    for site, ce, queue in queues:
        state = lock_director_queue(session, site, ce, queue, now=now)
        state.poll_failures += 1
        state.poll_error = storable(reason)
        state.poll_skip_until = now + _pause(base_backoff, state.poll_failures)
    session.flush()


def record_ce_answered(session: Session, queues: list[tuple[str, str, str]], *,
                       now: datetime) -> None:
    """A CE answered about its pilots: a poll back-off of its queues ends now (their failed
    submissions, if any, still count)."""
    for site, ce, queue in queues:
        state = session.get(DirectorQueue, (site, ce, queue), with_for_update=True)
        if state is not None and state.poll_failures:
            state.poll_failures, state.poll_error, state.poll_skip_until = 0, "", None
    session.flush()


def retry_queue(session: Session, site: str, ce: str, queue: str, *, by: str,
                now: datetime) -> DirectorQueue:
    """An operator's "retry now": the queue's back-offs end, whichever kind failed, a stop
    for pilots that failed to start is lifted, and the
    director tries it at its next cycle (its agent processes forget their own back-off of
    the queue's CE, agents.director). Raises NotFoundError when the director never served
    the queue."""
    state = session.get(DirectorQueue, (site, ce, queue), with_for_update=True)
    if state is None:
        raise NotFoundError(f"the site director has no record of queue {site}/{ce}/{queue}: "
                            "it never served it, so there is nothing to retry")
    if state.skip_until is not None and state.skip_until > now:
        # It stays in the past: idle_pilot_streak counts the pilots ended after it.
        state.skip_until = now
    state.failures = 0
    state.poll_failures, state.poll_skip_until = 0, None
    state.failed_starts, state.starts_error = 0, ""
    state.retry_requested_at, state.retry_requested_by = now, storable(by)
    session.flush()
    return state


def retry_requests(session: Session) -> dict[tuple[str, str, str], datetime]:
    """When an operator last asked to retry each queue (site, CE, queue) that was ever."""
    return {(site, ce, queue): at for site, ce, queue, at in session.execute(
        select(DirectorQueue.site, DirectorQueue.ce, DirectorQueue.queue,
               DirectorQueue.retry_requested_at)
        .where(DirectorQueue.retry_requested_at.is_not(None))) if at is not None}


def _pause(base_backoff: int, failures: int) -> timedelta:
    return timedelta(seconds=base_backoff * min(16, 2 ** (failures - 1)))


def _back_off(session: Session, site: str, ce: str, queue: str, *, reason: str,
              now: datetime, base_backoff: int) -> DirectorQueue:
    state = lock_director_queue(session, site, ce, queue, now=now)
    state.failures += 1
    state.last_error = storable(reason)
    state.skip_until = now + _pause(base_backoff, state.failures)
    session.flush()
    return state


def _locked(session: Session, vo: str, reference: str) -> Pilot | None:
    return session.scalars(select(Pilot).where(Pilot.reference == reference, Pilot.vo == vo)
                           .with_for_update()).one_or_none()


def idle_pilot_streak(session: Session, site: str, ce: str, queue: str, *,
                      length: int) -> int:
    """``length`` when the queue's last ``length`` ended pilots (since its last failure
    back-off) all ended without a job although, when the matcher last answered them "no
    job", work their queue could run was waiting (``Pilot.missed_work``), else 0: a sign that
    the pilots see the queue otherwise than the director does, and that submitting more only
    burns batch slots. A pilot that found nothing because other pilots had taken every job
    (an overshoot) breaks the streak."""
    state = session.get(DirectorQueue, (site, ce, queue))
    stmt = (select(Pilot.vo, Pilot.reference, Pilot.missed_work)
            .where(Pilot.site == site, Pilot.ce == ce, Pilot.queue == queue,
                   Pilot.status.in_(FINAL_PILOT_STATES),
                   # pilots that ran: the batch system took them and they spoke to the
                   # matcher
                   Pilot.native_id.is_not(None), Pilot.last_seen_at.is_not(None))
            .order_by(Pilot.updated_at.desc(), Pilot.id.desc()).limit(length))
    if state is not None and state.skip_until is not None:
        stmt = stmt.where(Pilot.updated_at > state.skip_until)
    ended = list(session.execute(stmt))
    if len(ended) < length or not all(row.missed_work for row in ended):
        return 0
    # A reference is unique per VO only: another VO's pilot may hold the same one.
    worked = session.scalar(select(func.count()).select_from(Job).where(
        or_(*(and_(Job.vo == vo, Job.pilot_reference == ref) for vo, ref, _ in ended))))
    return length if not worked else 0


def note_empty_answer(session: Session, vo: str, reference: str,
                      work_waiting: Callable[[Session, str, str, str], bool]
                      ) -> bool | None:
    """The matcher answered the VO's pilot "no job": note on its record (a director's
    pilot) whether work its queue could run was waiting then, as ``work_waiting(session,
    site, ce, queue)`` says. Once a pilot missed work it stays so (it is not asked again). Returns
    what was noted, None when nothing was (no such record)."""
    row = session.execute(select(Pilot.id, Pilot.site, Pilot.ce, Pilot.queue,
                                 Pilot.missed_work)
                          .where(Pilot.reference == reference, Pilot.vo == vo,
                                 Pilot.executor.is_not(None))).first()
    if row is None:
        return None
    if row.missed_work:
        return True
    missed = work_waiting(session, row.site, row.ce, row.queue)
    session.execute(update(Pilot).where(Pilot.id == row.id).values(missed_work=missed))
    return missed


def failed_start_streak(session: Session, site: str, ce: str, queue: str, *,
                        length: int) -> list[Pilot]:
    """The queue's last ``length`` ended pilots when every one of them is a failed start (its
    CE took it, and it ended without ever reaching the matcher: no ``last_seen_at``), else
    []. Only pilots that ended after the queue's last stop for failed starts and the last
    retry an operator asked for count; pilots an operator killed do not."""
    if length < 1:
        return []
    state = session.get(DirectorQueue, (site, ce, queue))
    stmt = (select(Pilot).where(Pilot.site == site, Pilot.ce == ce, Pilot.queue == queue,
                                Pilot.status.in_(FINAL_PILOT_STATES),
                                Pilot.native_id.is_not(None),
                                Pilot.kill_requested_by.is_(None))
            .order_by(Pilot.updated_at.desc(), Pilot.id.desc()).limit(length))
    if state is not None:
        for since in (state.starts_stopped_at, state.retry_requested_at):
            if since is not None:
                stmt = stmt.where(Pilot.updated_at > since)
    ended = list(session.scalars(stmt))
    if len(ended) < length or any(p.last_seen_at is not None for p in ended):
        return []
    return ended


def stop_for_failed_starts(session: Session, state: DirectorQueue, ended: list[Pilot], *,
                           now: datetime) -> str:
    """Stop the queue's submissions: its last pilots (``ended``, newest first) all failed to
    start. Returns the reason, kept on the queue."""
    last = ended[0]
    said = last.reason or (f"exit code {last.exit_code}" if last.exit_code is not None
                           else last.status)
    reason = storable(f"the last {len(ended)} pilots ended before they reached the matcher "
                      f"(last, {last.reference}: {said}); submissions stop until an "
                      "operator retries the queue or one of its pilots reaches the matcher")
    state.failed_starts, state.starts_error, state.starts_stopped_at = (
        len(ended), reason, now)
    session.flush()
    return reason


def starts_stopped(session: Session, state: DirectorQueue) -> str:
    """Why the queue's submissions are stopped for failed starts, "" when they are not (a
    pilot of the queue that reached the matcher since the stop lifts it)."""
    if not state.failed_starts:
        return ""
    since = state.starts_stopped_at
    reached = session.scalar(select(func.count()).select_from(Pilot).where(
        Pilot.site == state.site, Pilot.ce == state.ce, Pilot.queue == state.queue,
        Pilot.last_seen_at.is_not(None),
        *((Pilot.last_seen_at > since,) if since is not None else ())))
    if reached:
        state.failed_starts, state.starts_error = 0, ""
        session.flush()
        return ""
    return state.starts_error or f"{state.failed_starts} pilots in a row failed to start"


#: A pilot record still Submitting after this long was decided by a director that died
#: before submitting it. It has no CE id, so nothing to kill: it fails, counted with the
#: pilots killed for hanging in a CE state (``hung_in`` "Submitting";
#: taskqueue.pilots.pilotlogs.mark_hanging).
SUBMITTING_TIMEOUT = timedelta(minutes=10)


def expire_submitting(session: Session, site: str, ce: str, queue: str, *,
                      now: datetime) -> int:
    """Fail the queue's pilot records stuck in Submitting (their director died between the
    decision and the submission), so they stop counting as waiting; returns how many."""
    stuck = list(session.scalars(select(Pilot).where(
        Pilot.site == site, Pilot.ce == ce, Pilot.queue == queue,
        Pilot.status == "Submitting", Pilot.submitted_at < now - SUBMITTING_TIMEOUT)
        .with_for_update()))
    for pilot in stuck:
        pilot.status, pilot.updated_at = "Failed", now
        pilot.reason = "never submitted: the site director stopped before submitting it"
        pilot.hung_in = "Submitting"
        pilot.log_state, pilot.log_note = "unavailable", "never submitted"
    session.flush()
    return len(stuck)


@dataclass(frozen=True)
class PilotFilter:
    """Which pilots a listing shows: a VO's, narrowed by any of the other fields."""

    vo: str
    site: str | None = None
    ce: str | None = None
    queue: str | None = None
    status: str | None = None


def find_pilots(session: Session, which: PilotFilter, *, before: int | None = None,
                limit: int = 50) -> list[Pilot]:
    """A page of the pilots ``which`` selects, newest first, those with an id below
    ``before``."""
    stmt = select(Pilot).where(Pilot.vo == which.vo)
    if before is not None:
        stmt = stmt.where(Pilot.id < before)
    for column, value in ((Pilot.site, which.site), (Pilot.ce, which.ce),
                          (Pilot.queue, which.queue), (Pilot.status, which.status)):
        if value is not None:
            stmt = stmt.where(column == value)
    return list(session.scalars(stmt.order_by(Pilot.id.desc()).limit(limit)))


def pilot_of_vo(session: Session, vo: str, reference: str) -> Pilot:
    """The VO's pilot with that reference; NotFoundError otherwise."""
    pilot = session.scalars(select(Pilot).where(Pilot.reference == reference,
                                                Pilot.vo == vo)).one_or_none()
    if pilot is None:
        raise NotFoundError(f"pilot {reference} does not exist in VO {vo}")
    return pilot


def jobs_of_owner_on(session: Session, vo: str, reference: str, owner: str) -> set[int]:
    """The jobs of ``owner`` that the VO's pilot holds or held: those whose latest attempt is
    its own, and those it started that went on elsewhere (rescheduled)."""
    ran = select(PilotRun.job_id).where(PilotRun.vo == vo,
                                        PilotRun.pilot_reference == reference)
    return set(session.scalars(select(Job.id).where(
        Job.vo == vo, Job.owner == owner,
        or_(Job.pilot_reference == reference, Job.id.in_(ran)))))


def last_pilot_report(session: Session, vo: str, reference: str) -> JobStatusHistory | None:
    """The last thing the VO's pilot reported on one of its jobs (a status change it made),
    or None."""
    return session.scalars(
        select(JobStatusHistory).join(Job, Job.id == JobStatusHistory.job_id)
        .where(Job.pilot_reference == reference, Job.vo == vo,
               JobStatusHistory.source == "pilot")
        .order_by(JobStatusHistory.id.desc()).limit(1)).first()


def record_token_renewal(session: Session, vo: str, reference: str, *, now: datetime,
                         expires_at: datetime) -> Pilot:
    """Note that the VO's pilot is given a new token, expiring at ``expires_at``; a pilot that
    was killed, that ended by its record, or that the service does not know gets none
    (ForbiddenError, saying which)."""
    pilot = session.scalars(select(Pilot).where(Pilot.reference == reference, Pilot.vo == vo)
                            .with_for_update()).one_or_none()
    if pilot is None:
        raise ForbiddenError(f"pilot {reference} is not known in VO {vo}: it gets no new token")
    if pilot.kill_requested_by is not None:
        raise ForbiddenError(f"pilot {reference} was killed at the request of "
                             f"{pilot.kill_requested_by}: it gets no new token")
    if pilot.status in FINAL_PILOT_STATES:
        raise ForbiddenError(f"pilot {reference} has ended ({pilot.status}) by its record: it "
                             "gets no new token")
    pilot.token_renewals = (pilot.token_renewals or 0) + 1
    pilot.token_renewed_at, pilot.token_expires_at = now, expires_at
    session.flush()
    return pilot


#: What the matcher tells a pilot that must stop as a whole (its match requests and
#: heartbeats are answered with it).
STOP_PILOT = "kill"


def pilot_stop_reason(session: Session, vo: str, reference: str, *,
                      now: datetime) -> str | None:
    """Why the VO's pilot must stop as a whole, or None: an operator asked for it to be
    killed, or its record says it ended (its CE said so) while it still talks to the matcher;
    the first time the latter is seen it is noted on the record (``heard_after_end_at``).
    One lookup by the unique (reference, vo) index; an unknown pilot may go on."""
    row = session.execute(select(Pilot.id, Pilot.status, Pilot.kill_requested_by,
                                 Pilot.heard_after_end_at)
                          .where(Pilot.reference == reference, Pilot.vo == vo)).first()
    if row is None:
        return None
    if row.kill_requested_by is not None:
        return f"pilot {reference} was killed at the request of {row.kill_requested_by}"
    if row.status not in FINAL_PILOT_STATES:
        return None
    if row.heard_after_end_at is None:
        session.execute(update(Pilot).where(Pilot.id == row.id,
                                            Pilot.heard_after_end_at.is_(None))
                        .values(heard_after_end_at=now))
    return (f"pilot {reference} has ended ({row.status}) by its record, yet it still talks "
            "to the matcher")


def record_run(session: Session, vo: str, reference: str, job_id: int, *,
               now: datetime) -> None:
    """Note that the VO's pilot started ``job_id`` (once; a repeat is ignored)."""
    if session.get(PilotRun, (vo, reference, job_id)) is None:
        try:
            with session.begin_nested():
                session.add(PilotRun(vo=vo, pilot_reference=reference, job_id=job_id,
                                     started_at=now))
        except IntegrityError:  # noted by a concurrent report
            pass


def runs_of_pilot(session: Session, vo: str, reference: str, *, limit: int = 200
                  ) -> list[Job]:
    """Every job the VO's pilot ran or holds, newest first (at most ``limit``): those whose
    latest attempt is its own, and those it started that went on elsewhere (rescheduled).
    Each kind is read through its own index, at most ``limit`` of each; one statement with
    both in an OR read the jobs table back from its newest row instead."""
    held = session.scalars(select(Job.id).where(Job.pilot_reference == reference,
                                                Job.vo == vo)
                           .order_by(Job.id.desc()).limit(limit))
    ran = session.scalars(select(PilotRun.job_id).where(PilotRun.vo == vo,
                                                        PilotRun.pilot_reference == reference)
                          .order_by(PilotRun.job_id.desc()).limit(limit))
    ids = sorted({*held, *ran}, reverse=True)[:limit]
    if not ids:
        return []
    return list(session.scalars(select(Job).where(Job.id.in_(ids), Job.vo == vo)
                                .order_by(Job.id.desc())))
