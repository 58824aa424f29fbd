"""Sandbox records: which sandboxes exist, who owns them, which jobs reference them, who may
read them, the quota, usage per VO, and which ones the retention period has expired.

A sandbox is stored once whoever uploads it; each user who uploaded the same bytes (or whose
job's pilot uploaded them as the job's output) is one of its owners. A user reads only the
sandboxes they own; an operator those owned in their VO; a pilot those referenced by a job it
holds now. The bytes are in the sandbox store (taskqueue.files.sandboxstore).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, delete, exists, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from taskqueue.core.errors import ForbiddenError, InvalidInputError, NotFoundError
from taskqueue.core.states import FINAL_STATES, JobStatus
from taskqueue.db.models import Job, JobSandbox, Sandbox, SandboxOwner, SandboxQuotaLock

INPUT = "input"
OUTPUT = "output"

#: Statuses in which a job's pilot may read the job's sandboxes.
PILOT_READABLE = (JobStatus.MATCHED.value, JobStatus.RUNNING.value, JobStatus.STALLED.value,
                  JobStatus.COMPLETING.value)


class QuotaExceededError(ForbiddenError):
    """The upload would take its owner over their quota."""


@dataclass(frozen=True)
class Uploader:
    """Who a sandbox is stored for."""

    vo: str
    owner: str
    owner_group: str


def find_sandbox(session: Session, sandbox_id: str) -> Sandbox | None:
    return session.get(Sandbox, sandbox_id)


def recorded_sandboxes(session: Session, sandbox_ids: Sequence[str]) -> set[str]:
    """Those of ``sandbox_ids`` that have a record."""
    return set(session.scalars(select(Sandbox.id).where(Sandbox.id.in_(list(sandbox_ids)))))


def is_owner(session: Session, sandbox_id: str, vo: str, owner: str) -> bool:
    return session.get(SandboxOwner, (sandbox_id, vo, owner)) is not None


def user_usage(session: Session, vo: str, owner: str) -> int:
    """Bytes of the sandboxes ``owner`` uploaded (their jobs' outputs not counted)."""
    total = session.scalar(
        select(func.coalesce(func.sum(Sandbox.size), 0))
        .join(SandboxOwner, SandboxOwner.sandbox_id == Sandbox.id)
        .where(SandboxOwner.vo == vo, SandboxOwner.owner == owner, SandboxOwner.output == 0))
    return int(total or 0)


def lock_uploader(session: Session, who: Uploader) -> None:
    """Hold ``who``'s quota lock until the transaction ends (created on first use)."""
    key = {"vo": who.vo, "owner": who.owner}
    if session.get(SandboxQuotaLock, (who.vo, who.owner)) is None:
        savepoint = session.begin_nested()
        try:
            session.add(SandboxQuotaLock(**key))
            session.flush()
            savepoint.commit()
        except IntegrityError:  # created by a parallel upload: locking it waits for that one
            savepoint.rollback()
    session.execute(select(SandboxQuotaLock).where(
        SandboxQuotaLock.vo == who.vo, SandboxQuotaLock.owner == who.owner).with_for_update())


def check_quota(session: Session, who: Uploader, size: int, quota: int) -> None:
    """Raise :class:`QuotaExceededError` when ``size`` more bytes would exceed the quota.
    Takes ``who``'s quota lock first, so that parallel uploads are checked one at a time."""
    if quota <= 0:
        return
    lock_uploader(session, who)
    used = user_usage(session, who.vo, who.owner)
    if used + size > quota:
        raise QuotaExceededError(
            f"this sandbox ({size} bytes) would take {who.owner}'s sandboxes to {used + size} "
            f"bytes, over the quota of {quota} bytes; sandboxes of jobs that ended are removed "
            "after the retention period")


def register_sandbox(session: Session, sandbox_id: str, size: int, who: Uploader, *,
                     now: datetime, output: bool = False, quota: int = 0) -> bool:
    """Record ``who`` as an owner of the stored sandbox (recording the sandbox itself when it
    is new); return whether ``who`` owned it already. The quota is checked for a new owner
    of a user upload."""
    if is_owner(session, sandbox_id, who.vo, who.owner):
        return True
    if not output:
        check_quota(session, who, size, quota)
    if session.get(Sandbox, sandbox_id) is None:
        savepoint = session.begin_nested()
        try:
            session.add(Sandbox(id=sandbox_id, size=size, created_at=now))
            session.flush()
            savepoint.commit()
        except IntegrityError:  # another process recorded the same bytes at the same time
            savepoint.rollback()
    savepoint = session.begin_nested()
    try:
        session.add(SandboxOwner(sandbox_id=sandbox_id, vo=who.vo, owner=who.owner,
                                 owner_group=who.owner_group, output=int(output),
                                 created_at=now))
        session.flush()
        savepoint.commit()
    except IntegrityError:
        savepoint.rollback()
        return True
    return False


def unusable_inputs(session: Session, sandbox_ids: Iterable[str], vo: str, owner: str
                    ) -> list[str]:
    """The sandboxes of ``sandbox_ids`` that do not exist or that ``owner`` does not own."""
    wanted = sorted(set(sandbox_ids))
    if not wanted:
        return []
    owned = set(session.scalars(select(SandboxOwner.sandbox_id).where(
        SandboxOwner.sandbox_id.in_(wanted), SandboxOwner.vo == vo,
        SandboxOwner.owner == owner)))
    return [s for s in wanted if s not in owned]


def reference(session: Session, links: Iterable[tuple[int, str]], kind: str) -> None:
    """Record that each job of ``links`` references its sandbox (as input or output)."""
    rows = sorted(set(links))
    for job_id, sandbox_id in rows:
        if session.get(JobSandbox, (job_id, sandbox_id, kind)) is None:
            session.add(JobSandbox(job_id=job_id, sandbox_id=sandbox_id, kind=kind))
    session.flush()


def attach_output(session: Session, job_id: int, sandbox_id: str, *, vo: str,
                  pilot_reference: str) -> None:
    """Record the output sandbox a job's pilot uploaded; it must be stored for the job's
    owner. A job that is not (or no longer) the pilot's is left alone: the status report
    that carries the sandbox decides what to answer."""
    job = session.get(Job, job_id)
    if job is None or job.vo != vo or job.pilot_reference != pilot_reference:
        return
    if not is_owner(session, sandbox_id, job.vo, job.owner):
        raise InvalidInputError(f"output sandbox {sandbox_id} was not uploaded for job "
                                f"{job_id}: upload it first (POST /api/v1/sandboxes)")
    reference(session, [(job_id, sandbox_id)], OUTPUT)


def job_sandboxes(session: Session, job_id: int, kind: str) -> list[str]:
    return list(session.scalars(select(JobSandbox.sandbox_id).where(
        JobSandbox.job_id == job_id, JobSandbox.kind == kind).order_by(JobSandbox.sandbox_id)))


def readable_by_operator(session: Session, sandbox_id: str, vo: str) -> bool:
    return session.scalar(select(exists().where(
        SandboxOwner.sandbox_id == sandbox_id, SandboxOwner.vo == vo))) is True


def readable_by_pilot(session: Session, sandbox_id: str, vo: str, pilot_reference: str
                      ) -> bool:
    """Whether the pilot holds, now, a job of its VO that references the sandbox."""
    return session.scalar(select(exists().where(
        JobSandbox.sandbox_id == sandbox_id, JobSandbox.job_id == Job.id, Job.vo == vo,
        Job.pilot_reference == pilot_reference, Job.status.in_(PILOT_READABLE)))) is True


def pilot_holds(session: Session, job_id: int, vo: str, pilot_reference: str) -> Job:
    """The job, when the pilot holds it now; otherwise 404 (another pilot's job, or another
    VO's, is as good as absent)."""
    job = session.get(Job, job_id)
    if (job is None or job.vo != vo or job.pilot_reference != pilot_reference
            or job.status not in PILOT_READABLE):
        raise NotFoundError(f"job {job_id} is not a job pilot {pilot_reference} holds")
    return job


@dataclass(frozen=True)
class VoUsage:
    vo: str
    sandboxes: int
    bytes: int


def usage_by_vo(session: Session) -> list[VoUsage]:
    """Sandboxes and bytes stored per VO (a sandbox owned in two VOs counts in each)."""
    pairs = (select(SandboxOwner.vo, SandboxOwner.sandbox_id).distinct().subquery())
    rows = session.execute(
        select(pairs.c.vo, func.count(), func.coalesce(func.sum(Sandbox.size), 0))
        .join(Sandbox, Sandbox.id == pairs.c.sandbox_id)
        .group_by(pairs.c.vo).order_by(pairs.c.vo))
    return [VoUsage(vo, int(n), int(size)) for vo, n, size in rows]


def expired_sandboxes(session: Session, *, now: datetime, retention: int,
                      limit: int = 1000, among: Sequence[str] | None = None) -> list[str]:
    """Sandboxes no live job references, older than the retention period, whose referencing
    jobs all ended more than the retention period ago (only those of ``among`` when given)."""
    cutoff = now - timedelta(seconds=retention)
    final = [s.value for s in FINAL_STATES]
    in_use = exists().where(
        JobSandbox.sandbox_id == Sandbox.id, JobSandbox.job_id == Job.id,
        ~and_(Job.status.in_(final),
              func.coalesce(Job.ended_at, Job.submitted_at) < cutoff))
    # Locked: a job submitted meanwhile with one of them waits, then finds it gone.
    stmt = select(Sandbox.id).where(Sandbox.created_at < cutoff, ~in_use)
    if among is not None:
        stmt = stmt.where(Sandbox.id.in_(list(among)))
    return list(session.scalars(stmt.order_by(Sandbox.id).limit(limit).with_for_update()))


def forget_sandboxes(session: Session, sandbox_ids: Sequence[str]) -> None:
    """Delete the records of ``sandbox_ids`` (their owners, and references by ended jobs)."""
    if not sandbox_ids:
        return
    ids = list(sandbox_ids)
    session.execute(delete(JobSandbox).where(JobSandbox.sandbox_id.in_(ids)))
    session.execute(delete(SandboxOwner).where(SandboxOwner.sandbox_id.in_(ids)))
    session.execute(delete(Sandbox).where(Sandbox.id.in_(ids)))


def known_ids(session: Session, sandbox_ids: Iterable[str]) -> set[str]:
    wanted = list(set(sandbox_ids))
    if not wanted:
        return set()
    return set(session.scalars(select(Sandbox.id).where(Sandbox.id.in_(wanted))))
