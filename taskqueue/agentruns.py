"""When each periodic agent loop last ran, shared by every agent process through the database:
a loop runs in one process at a time, and not again before its interval has passed.

A turn is held by a heartbeat: the process running the loop renews it (``renew_run``) well
within the lease while the loop runs, so a turn whose process died is free once the lease has
passed since its last renewal, however long the loop itself may take.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from taskqueue.db.models import AgentRun


def start_run(session: Session, name: str, *, holder: str, now: datetime, interval: int,
              lease: int, force: bool = False) -> bool:
    """Take the turn to run loop ``name``; False when another process runs it now (not
    finished, and started or renewed less than ``lease`` seconds ago), or (unless ``force``)
    when it ran less than ``interval`` seconds ago and finished (a turn cut short is due
    again once its lease passed)."""
    run = session.get(AgentRun, name, with_for_update=True)
    if run is None:
        try:
            with session.begin_nested():
                session.add(AgentRun(name=name, started_at=now, renewed_at=now, holder=holder,
                                     summary=""))
            return True
        except IntegrityError:  # a concurrent process created it: decide on its row
            run = session.get(AgentRun, name, with_for_update=True, populate_existing=True)
            assert run is not None
    alive_at = max(run.started_at, run.renewed_at or run.started_at)
    running = run.finished_at is None and now - alive_at < timedelta(seconds=lease)
    if running and run.holder != holder:
        return False
    # A turn that never finished and is no longer renewed was cut short (its process was
    # killed): the loop did not do its work, so it is due again as soon as its lease passed.
    abandoned = run.finished_at is None and not running
    if not force and not abandoned and now - run.started_at < timedelta(seconds=interval):
        return False
    run.started_at, run.renewed_at, run.finished_at, run.holder = now, now, None, holder
    session.flush()
    return True


def renew_run(session: Session, name: str, *, holder: str, now: datetime) -> bool:
    """Renew ``holder``'s running turn of loop ``name``; False when it no longer holds it."""
    result = session.execute(
        update(AgentRun)
        .where(AgentRun.name == name, AgentRun.holder == holder,
               AgentRun.finished_at.is_(None))
        .values(renewed_at=now)
        .execution_options(synchronize_session=False))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def finish_run(session: Session, name: str, *, holder: str, now: datetime,
               summary: str) -> None:
    run = session.get(AgentRun, name, with_for_update=True)
    if run is not None and run.holder == holder:
        run.finished_at, run.summary = now, summary[:255]
        session.flush()
