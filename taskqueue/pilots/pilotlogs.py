"""Pilots the site director follows to their end, and what it keeps of them.

The director submitted the pilot through a compute element; until the CE says the pilot
ended, the pilot is *followed* (``log_state`` NULL): its CE is asked for its state, an
operator's kill request is passed on, and once it ended its standard output and error are
fetched, kept as a small archive in the sandbox store (a sandbox record owned by
``pilot-log:<reference>``, so the sandbox cleanup removes it after the retention period) and
the CE forgets the pilot. The archive holds ``pilot.out`` and ``pilot.err``. A user reads the
part of a log that concerns their own jobs (:func:`part_for_owner`), an operator all of it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import tarfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from taskqueue.core.errors import InvalidInputError, NotFoundError
from taskqueue.db.models import Pilot
from taskqueue.files.sandboxes import Uploader, register_sandbox
from taskqueue.pilots.records import FINAL_PILOT_STATES, PILOT_STATES, may_move, storable

STORED, UNAVAILABLE = "stored", "unavailable"
#: The archive's members.
STDOUT_MEMBER, STDERR_MEMBER = "pilot.out", "pilot.err"
#: The owner of a pilot's log among the sandbox owners.
OWNER_PREFIX = "pilot-log:"


@dataclass(frozen=True)
class FollowedPilot:
    """A pilot whose end the director has not seen yet."""

    vo: str
    reference: str
    site: str
    ce: str
    queue: str
    executor: str
    native_id: str
    status: str
    kill_requested_by: str | None
    updated_at: datetime | None


def pilots_to_follow(session: Session, *, limit: int = 100_000) -> list[FollowedPilot]:
    """The pilots the director submitted and still follows, oldest first."""
    pilots = session.scalars(
        select(Pilot).where(Pilot.log_state.is_(None), Pilot.executor.is_not(None),
                            Pilot.native_id.is_not(None))
        .order_by(Pilot.id).limit(limit))
    return [FollowedPilot(p.vo, p.reference, p.site, p.ce, p.queue, p.executor or "",
                          p.native_id or "", p.status, p.kill_requested_by, p.updated_at)
            for p in pilots]


def record_ce_state(session: Session, vo: str, reference: str, *, status: str, reason: str,
                    exit_code: int | None, now: datetime, ce_state: str = "") -> bool:
    """What the pilot's CE says: the status moves forward only (a pilot that said Done
    itself stays Done), the exit code is noted, and the CE's own word for the state
    (``ce_state``, kept with the time it was first said); returns whether the status
    moved."""
    if status not in PILOT_STATES:
        raise InvalidInputError(f"pilot status must be one of {', '.join(PILOT_STATES)}, "
                                f"got {status!r}")
    pilot = _pilot(session, vo, reference)
    if exit_code is not None:
        pilot.exit_code = exit_code
    if ce_state and ce_state[:32] != pilot.ce_state:
        pilot.ce_state, pilot.ce_state_since = ce_state[:32], now
    if not may_move(pilot.status, status) or status == pilot.status:
        return False
    pilot.status, pilot.updated_at = status, now
    if reason:
        pilot.reason = storable(reason)
    session.flush()
    return True


@dataclass(frozen=True)
class HangingPilot:
    """A pilot that stayed in one state of its CE past that state's timeout."""

    vo: str
    reference: str
    native_id: str
    ce_state: str
    #: How long it stayed, in whole seconds.
    seconds: int


def mark_hanging(session: Session, pilots: Collection[tuple[str, str]], *,
                 timeouts: Mapping[str, int], now: datetime) -> list[HangingPilot]:
    """Of the (VO, reference) ``pilots``, those not ended and not to be killed yet whose
    CE has said the same state for longer than ``timeouts`` gives for it (seconds by CE
    state; a state missing or 0 never times out): each is to be killed through its CE (as
    an operator's kill, so the matcher gives it no job from now on) and keeps the state it
    hung in and why ("stuck in ACCEPTING for 960 s: killed"). Returns them."""
    limits = {state: seconds for state, seconds in timeouts.items() if seconds > 0}
    wanted = set(pilots)
    if not limits or not wanted:
        return []
    earliest = now - timedelta(seconds=min(limits.values()))
    found: list[HangingPilot] = []
    references = sorted({reference for _, reference in wanted})
    for start in range(0, len(references), 500):
        rows = session.scalars(select(Pilot).where(
            Pilot.reference.in_(references[start:start + 500]),
            Pilot.ce_state.in_(sorted(limits)), Pilot.ce_state_since < earliest,
            Pilot.kill_requested_by.is_(None), Pilot.status.not_in(FINAL_PILOT_STATES))
            .order_by(Pilot.id).with_for_update())
        for pilot in rows:
            since = pilot.ce_state_since
            if (pilot.vo, pilot.reference) not in wanted or since is None:
                continue
            seconds = int((now - since).total_seconds())
            if seconds <= limits[pilot.ce_state]:
                continue
            pilot.kill_requested_by = "the pilots loop"
            pilot.hung_in = pilot.ce_state
            pilot.reason = f"stuck in {pilot.ce_state} for {seconds} s: killed"
            pilot.updated_at = now
            found.append(HangingPilot(pilot.vo, pilot.reference, pilot.native_id or "",
                                      pilot.ce_state, seconds))
    session.flush()
    return found


def request_kill(session: Session, vo: str, reference: str, *, by: str,
                 now: datetime) -> Pilot:
    """Note that ``by`` wants the VO's pilot killed. From then on the matcher gives it no job
    and answers its match requests and heartbeats with "kill" (the pilot stops its payloads
    and hands their jobs back); for a pilot the director submitted (one with a CE record)
    the director also passes the request to its CE at its next turn. Any pilot the service
    knows may be killed, a pilot started by hand too, and one whose record says it ended
    (it may live on); a repeated request keeps the first requester. Raises NotFoundError."""
    pilot = _pilot(session, vo, reference)
    if pilot.kill_requested_by is None:
        pilot.kill_requested_by = by[:255]
        pilot.updated_at = now
    session.flush()
    return pilot


def record_killed(session: Session, vo: str, reference: str, *, now: datetime) -> None:
    """The CE took the kill request: the pilot is Aborted, and says who killed it."""
    pilot = _pilot(session, vo, reference)
    if pilot.status not in FINAL_PILOT_STATES:
        pilot.status, pilot.updated_at = "Aborted", now
        if pilot.hung_in is None:  # else its reason says where it hung
            pilot.reason = storable(
                f"killed through its CE at the request of {pilot.kill_requested_by}")
    session.flush()


def record_log(session: Session, vo: str, reference: str, *, log_id: str | None, size: int,
               note: str, now: datetime, reason: str = "") -> None:
    """The pilot's end is seen: its log is stored as ``log_id`` (a sandbox of ``size`` bytes
    already in the store), or there is none, for the reason ``note``. A ``reason`` (the
    pilot's own word on why it stopped) replaces the one its status had."""
    pilot = _pilot(session, vo, reference)
    if reason:
        pilot.reason = storable(reason)
    if log_id is not None:
        register_sandbox(session, log_id, size,
                         Uploader(vo, OWNER_PREFIX + reference, f"{vo}_pilot"), now=now,
                         output=True)
        pilot.log_state, pilot.log_id = STORED, log_id
    else:
        pilot.log_state = UNAVAILABLE
    pilot.log_note = storable(note)
    session.flush()


def stop_following(session: Session, *, now: datetime, patience: timedelta) -> int:
    """Pilots that ended by their own word (or their director's) longer than ``patience``
    ago, and whose CE never confirmed it, are no longer followed; returns how many."""
    stale = list(session.scalars(select(Pilot).where(
        Pilot.log_state.is_(None), Pilot.status.in_(FINAL_PILOT_STATES),
        Pilot.updated_at < now - patience).with_for_update()))
    for pilot in stale:
        pilot.log_state = UNAVAILABLE
        pilot.log_note = (f"its CE did not report its end within "
                          f"{int(patience.total_seconds())} s of it")
    session.flush()
    return len(stale)


def _pilot(session: Session, vo: str, reference: str) -> Pilot:
    pilot = session.scalars(select(Pilot).where(Pilot.vo == vo, Pilot.reference == reference)
                            .with_for_update()).one_or_none()
    if pilot is None:
        raise NotFoundError(f"pilot {reference} does not exist in VO {vo}")
    return pilot


# -- the archive ---------------------------------------------------------------------------------

def pack_log(stdout: bytes, stderr: bytes) -> tuple[str, bytes]:
    """The archive of a pilot's output and its sandbox id. The same output gives the same
    bytes (no times or owners in it)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((STDOUT_MEMBER, stdout), (STDERR_MEMBER, stderr)):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    packed = gzip.compress(raw.getvalue(), mtime=0)
    return f"sb:sha256:{hashlib.sha256(packed).hexdigest()}", packed


@dataclass(frozen=True)
class PilotLog:
    stdout: str
    stderr: str


def unpack_log(packed: bytes, *, limit: int) -> PilotLog:
    """The texts of an archive made by :func:`pack_log` (each at most ``limit`` bytes, as
    stored); undecodable bytes are shown as U+FFFD. Raises ValueError for anything else."""
    most = 2 * limit + 64 * 1024
    try:
        # Decompressed only as far as a kept log can reach: a bomb costs no more than that.
        with gzip.GzipFile(fileobj=io.BytesIO(packed)) as gz:
            raw = gz.read(most + 1)
    except (OSError, EOFError) as exc:
        raise ValueError(f"not a pilot log archive: {exc}") from exc
    if len(raw) > most:
        raise ValueError("the pilot log archive is larger than any pilot log kept")
    texts: dict[str, str] = {}
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        for member in tar.getmembers():
            if member.name in (STDOUT_MEMBER, STDERR_MEMBER) and member.isfile():
                f = tar.extractfile(member)
                assert f is not None
                texts[member.name] = f.read(limit).decode("utf-8", "replace")
    return PilotLog(texts.get(STDOUT_MEMBER, ""), texts.get(STDERR_MEMBER, ""))


#: The start of a record of the pilot's log (pilot.logformat): time, level, logger, and the
#: job the record concerns alone, when it does.
_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [^\s:\[]+"
                     r"(?: \[job (\d+)\])?: ")
#: A job named in a record's text ("job 42", "job_42", "jobs 42", "job_id=42").
_NAMED_JOB = re.compile(r"\bjob(?:s|_id|\s+id)?[\s_#:=]*(\d+)", re.IGNORECASE)
#: What pilot-wide records of pilots before the job marks say of a job's files without its id.
_UNMARKED_JOB_TEXT = ("leaves the job folder",)


@dataclass(frozen=True)
class LogPart:
    """The part of a pilot's output that a user may read, and how many lines were left out."""

    text: str
    hidden_lines: int


def part_for_owner(text: str, own_jobs: Collection[int]) -> LogPart:
    """The records of a pilot's output ``text`` that concern the jobs ``own_jobs`` of one
    user: those the pilot marked with one of these jobs, and the pilot-wide ones (unmarked:
    all of an older pilot's records) that name no other job, nor a job's file. A record's
    further lines (indented by the pilot) go with it, so that a message's text cannot pass
    for a record of its own."""
    body = text[:-1] if text.endswith("\n") else text
    if not body:
        return LogPart(text, 0)
    kept: list[str] = []
    hidden = 0
    for job, lines in _records(body.split("\n")):
        if _may_read(job, lines, own_jobs):
            kept.extend(lines)
        else:
            hidden += len(lines)
    shown = "\n".join(kept)
    return LogPart(shown + "\n" if kept and text.endswith("\n") else shown, hidden)


def _records(lines: list[str]) -> list[tuple[int | None, list[str]]]:
    """The lines grouped by record, each with the job of its mark (None: pilot-wide). An
    indented line continues the record before it; any other line that starts no record
    (what the pilot prints, such as its exit line) is pilot-wide."""
    records: list[tuple[int | None, list[str]]] = []
    for line in lines:
        if records and line[:1].isspace():
            records[-1][1].append(line)
            continue
        start = _RECORD.match(line)
        records.append((int(start.group(1)) if start and start.group(1) else None, [line]))
    return records


def _may_read(job: int | None, lines: list[str], own_jobs: Collection[int]) -> bool:
    if job is not None:
        return job in own_jobs
    text = "\n".join(lines)
    if any(words in text for words in _UNMARKED_JOB_TEXT):
        return False
    return all(int(named) in own_jobs for named in _NAMED_JOB.findall(text))


def exit_reason(stderr: bytes, exit_code: int | None) -> str:
    """Why the pilot stopped, in its own words: the last line it wrote on stderr when it
    exited with a code other than 0 (the pilot's documented way of saying why)."""
    if not exit_code:
        return ""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines()]
    last = next((line for line in reversed(lines) if line), "")
    return f"exit code {exit_code}: {last}" if last else f"exit code {exit_code}"
