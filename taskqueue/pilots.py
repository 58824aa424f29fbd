"""The pilot registry: which pilots exist, where, in what state, and when they last spoke."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from taskqueue.errors import ForbiddenError, InvalidInputError
from taskqueue.models import Pilot

#: The states of a pilot's life, as its batch system and the pilot itself report them.
PILOT_STATES: tuple[str, ...] = ("Submitted", "Waiting", "Running", "Done", "Failed",
                                 "Aborted", "Lost")


@dataclass(frozen=True)
class PilotInfo:
    reference: str
    site: str
    ce: str
    queue: str
    status: str


def register_pilot(session: Session, vo: str, info: PilotInfo, *, now: datetime) -> Pilot:
    """Create the pilot's record, or bring it up to date (same reference, same VO)."""
    if not info.reference.strip():
        raise InvalidInputError("a pilot reference must not be empty")
    if info.status not in PILOT_STATES:
        raise InvalidInputError(
            f"pilot status must be one of {', '.join(PILOT_STATES)}, got {info.status!r}")
    pilot = _locked(session, info.reference)
    if pilot is None:
        try:
            with session.begin_nested():
                pilot = Pilot(reference=info.reference, vo=vo, site=info.site, ce=info.ce,
                              queue=info.queue, status=info.status, submitted_at=now,
                              last_seen_at=now)
                session.add(pilot)
            return pilot
        except IntegrityError:  # registered by a concurrent call: update that record
            pilot = _locked(session, info.reference)
            assert pilot is not None
    if pilot.vo != vo:
        raise ForbiddenError(f"pilot {info.reference} belongs to another VO")
    pilot.site, pilot.ce, pilot.queue = info.site, info.ce, info.queue
    pilot.status, pilot.last_seen_at = info.status, now
    session.flush()
    return pilot


def _locked(session: Session, reference: str) -> Pilot | None:
    return session.scalars(select(Pilot).where(Pilot.reference == reference)
                           .with_for_update()).one_or_none()
