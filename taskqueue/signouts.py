"""Dashboard sessions signed out before their cookies expire: a signed cookie stays valid until
its expiry, so signing out records the session here and every page checks it (one primary-key
lookup). A record goes once the session would have ended anyway."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.orm import Session

from taskqueue.db.models import DashboardSignOut


def record_sign_out(session: Session, session_id: str, *, expires_at: datetime,
                    now: datetime) -> None:
    """Record that ``session_id`` was signed out (and forget those that expired)."""
    session.execute(delete(DashboardSignOut).where(DashboardSignOut.expires_at < now))
    if session.get(DashboardSignOut, session_id) is None:
        session.add(DashboardSignOut(session_id=session_id, expires_at=expires_at))


def is_signed_out(session: Session, session_id: str) -> bool:
    return session.get(DashboardSignOut, session_id) is not None
