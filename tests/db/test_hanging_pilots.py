"""Pilots that hang in one state of their CE: the CE's own word for the state is kept with the
time it was first said, a pilot past that state's timeout is marked to be killed once, with the
state it hung in and why, and is counted per queue and state; a pilot that moved on, ended, or
is in a state without a timeout is left alone; a director that died before submitting counts
as "Submitting"."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select

from taskqueue.db.models import Pilot
from taskqueue.pilots.monitoring import pilots_stuck_since
from taskqueue.pilots.pilotlogs import mark_hanging, record_ce_state, record_killed
from taskqueue.pilots.records import (
    expire_submitting,
    pilot_stop_reason,
    record_new_pilots,
    record_submission,
)
from tests.conftest import Database

SITE, CE, QUEUE = "ARC.Local.test", "arc1", "fork"
S = timedelta(seconds=1)
#: As the pilots loop passes them for an ARC-CE, small.
TIMEOUTS = {"ACCEPTING": 60, "PREPARING": 60, "HELD": 120, "QUEUING": 0}


def submitted(db: Database, references: list[str], now: datetime) -> None:
    with db.factory.begin() as s:
        record_new_pilots(s, "lhcb", SITE, CE, QUEUE, "arc", references, now=now)
        for reference in references:
            record_submission(s, reference, f"arc-{reference}", now=now)


def say(db: Database, reference: str, status: str, ce_state: str, now: datetime) -> None:
    with db.factory.begin() as s:
        record_ce_state(s, "lhcb", reference, status=status, reason="", exit_code=None,
                        now=now, ce_state=ce_state)


def pilot(db: Database, reference: str) -> Pilot:
    with db.factory() as s:
        row = s.scalars(select(Pilot).where(Pilot.reference == reference)).one()
        s.expunge(row)
        return row


def mark(db: Database, references: list[str], now: datetime) -> list[tuple[str, str, int]]:
    with db.factory.begin() as s:
        return [(h.reference, h.ce_state, h.seconds) for h in mark_hanging(
            s, [("lhcb", r) for r in references], timeouts=TIMEOUTS, now=now)]


def test_the_ce_state_is_kept_with_the_time_it_was_first_said(db: Database,
                                                              now: datetime) -> None:
    submitted(db, ["p1"], now)
    say(db, "p1", "Submitted", "ACCEPTING", now + 5 * S)
    say(db, "p1", "Submitted", "ACCEPTING", now + 50 * S)  # the same word: since stays
    row = pilot(db, "p1")
    assert (row.ce_state, row.ce_state_since) == ("ACCEPTING", now + 5 * S)
    say(db, "p1", "Submitted", "PREPARING", now + 70 * S)  # status unchanged, state moves
    row = pilot(db, "p1")
    assert (row.status, row.ce_state, row.ce_state_since) == (
        "Submitted", "PREPARING", now + 70 * S)


def test_a_pilot_past_its_states_timeout_is_marked_once_and_counted(db: Database,
                                                                    now: datetime) -> None:
    refs = ["stuck", "young", "moved", "queued", "held", "ended", "other-vo"]
    submitted(db, refs, now)
    for ref in refs:
        say(db, ref, "Submitted", "ACCEPTING", now)
    say(db, "moved", "Submitted", "PREPARING", now + 100 * S)   # moved on: its clock restarts
    say(db, "young", "Submitted", "PREPARED", now)              # PREPARED has no timeout here
    say(db, "queued", "Waiting", "QUEUING", now)                # 0: never
    say(db, "held", "Waiting", "HELD", now)                     # 120 s
    say(db, "ended", "Failed", "FAILED", now + 10 * S)

    at = now + 150 * S
    found = mark(db, refs[:-1], at)  # other-vo is not among those asked about
    assert sorted(found) == [("held", "HELD", 150), ("stuck", "ACCEPTING", 150)]
    stuck = pilot(db, "stuck")
    assert (stuck.hung_in, stuck.kill_requested_by, stuck.reason) == (
        "ACCEPTING", "the pilots loop", "stuck in ACCEPTING for 150 s: killed")
    assert pilot(db, "moved").hung_in is None and pilot(db, "other-vo").hung_in is None
    # Marked once: asked again, nothing new (the kill is passed on as an operator's is).
    assert mark(db, refs, at + 60 * S) == [("moved", "PREPARING", 110), ("other-vo",
                                                                          "ACCEPTING", 210)]

    # The CE took the kill: Aborted, and the reason still says where it hung.
    with db.factory.begin() as s:
        record_killed(s, "lhcb", "stuck", now=at)
    stuck = pilot(db, "stuck")
    assert (stuck.status, stuck.reason) == ("Aborted", "stuck in ACCEPTING for 150 s: killed")
    # A hung pilot that starts after all gets no job: the matcher tells it to stop.
    with db.factory.begin() as s:
        assert pilot_stop_reason(s, "lhcb", "held", now=at) == (
            "pilot held was killed at the request of the pilots loop")

    with db.factory() as s:
        assert pilots_stuck_since(s, now) == {(SITE, CE, QUEUE, "ACCEPTING"): 2,
                                              (SITE, CE, QUEUE, "PREPARING"): 1,
                                              (SITE, CE, QUEUE, "HELD"): 1}
        assert pilots_stuck_since(s, at + 3600 * S) == {}


def test_a_pilot_its_director_never_submitted_counts_as_hung_in_submitting(
        db: Database, now: datetime) -> None:
    with db.factory.begin() as s:
        record_new_pilots(s, "lhcb", SITE, CE, QUEUE, "arc", ["never"], now=now)
    with db.factory.begin() as s:
        assert expire_submitting(s, SITE, CE, QUEUE, now=now + 11 * 60 * S) == 1
    assert pilot(db, "never").hung_in == "Submitting"
    with db.factory() as s:
        assert pilots_stuck_since(s, now) == {(SITE, CE, QUEUE, "Submitting"): 1}
