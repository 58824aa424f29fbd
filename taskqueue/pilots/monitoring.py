"""What the agents' metrics read from the database at each scrape (agents.metrics): when each
agent loop last ran and whether it failed, the pilots that ended lately per site and how, and
the site director's failures in a row per queue. Each is one small query: the loops and the
director's queues are small tables, the pilots are read through their index on updated_at
(only those that changed since the moment asked for)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from taskqueue.db.models import AgentRun, DirectorQueue, Pilot
from taskqueue.pilots.records import FINAL_PILOT_STATES

#: How a loop's summary starts when the loop raised (agents.runner writes it).
FAILED_SUMMARY = "failed: "


@dataclass(frozen=True)
class LoopRun:
    """An agent loop's last turn, whichever agent process took it."""

    name: str
    started_at: datetime
    #: The last sign of life: the start, a renewal of the turn, or the end.
    seen_at: datetime
    finished_at: datetime | None
    failed: bool


def loop_runs(session: Session) -> list[LoopRun]:
    """Every loop that ever ran, by name."""
    out = []
    for run in session.scalars(select(AgentRun).order_by(AgentRun.name)):
        seen = max(t for t in (run.started_at, run.renewed_at, run.finished_at) if t is not None)
        out.append(LoopRun(run.name, run.started_at, seen, run.finished_at,
                           run.finished_at is not None
                           and run.summary.startswith(FAILED_SUMMARY)))
    return out


def pilots_ended_since(session: Session, since: datetime) -> dict[tuple[str, str, str], int]:
    """The pilots that reached a final status (Done, Failed, Aborted, Lost) since ``since``,
    per (VO, site, status)."""
    p = Pilot.__table__.c
    return {(vo, site, status): int(n) for vo, site, status, n in session.execute(
        select(p.vo, p.site, p.status, func.count())
        .where(p.updated_at >= since, p.status.in_(sorted(FINAL_PILOT_STATES)))
        .group_by(p.vo, p.site, p.status))}


def pilots_stuck_since(session: Session, since: datetime, *, vo: str | None = None
                       ) -> dict[tuple[str, str, str, str], int]:
    """The pilots (of ``vo``, or of every VO) killed since ``since`` for hanging in one
    state of their CE past its timeout (taskqueue.pilots.pilotlogs.mark_hanging), and those
    whose director never submitted them ("Submitting"), per (site, CE, queue, state)."""
    p = Pilot.__table__.c
    query = (select(p.site, p.ce, p.queue, p.hung_in, func.count())
             .where(p.updated_at >= since, p.hung_in.is_not(None))
             .group_by(p.site, p.ce, p.queue, p.hung_in))
    if vo is not None:
        query = query.where(p.vo == vo)
    return {(site, ce, queue, state): int(n)
            for site, ce, queue, state, n in session.execute(query)}


def director_failures(session: Session
                      ) -> dict[tuple[str, str, str], tuple[int, int, int, int]]:
    """Per (site, CE, queue) the site director served: its submission failures in a row,
    its CE's failed polls in a row, the failed starts in a row that stopped its submissions
    (0: not stopped), and its pilots that never reached its CE, in all."""
    return {(row.site, row.ce, row.queue): (row.failures, row.poll_failures,
                                            row.failed_starts, row.unsent_pilots)
            for row in session.scalars(select(DirectorQueue))}
