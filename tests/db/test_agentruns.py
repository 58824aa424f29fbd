"""Agent loop turns in the database: a turn is held while its process renews it, and free once
the lease has passed since the last renewal, whenever the loop started."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial

from taskqueue.agentruns import finish_run, renew_run, start_run
from taskqueue.db.database import run_in_transaction
from tests.conftest import Database

LEASE = 90
S = timedelta(seconds=1)


def take(db: Database, holder: str, at: datetime, *, force: bool = True) -> bool:
    return run_in_transaction(db.factory, partial(
        start_run, name="watchdog", holder=holder, now=at, interval=60, lease=LEASE,
        force=force))


def renew(db: Database, holder: str, at: datetime) -> bool:
    return run_in_transaction(db.factory, partial(renew_run, name="watchdog", holder=holder,
                                                  now=at))


def test_a_renewed_turn_stays_held_past_the_lease(db: Database, now: datetime) -> None:
    assert take(db, "a:1", now)
    for minute in range(1, 11):  # a loop running for ten minutes, renewed every minute
        assert renew(db, "a:1", now + minute * 60 * S)
        assert not take(db, "b:2", now + minute * 60 * S + S)


def test_a_turn_nobody_renews_is_free_after_the_lease(db: Database, now: datetime) -> None:
    assert take(db, "a:1", now)
    assert renew(db, "a:1", now + 60 * S)
    assert not take(db, "b:2", now + 60 * S + (LEASE - 1) * S)
    assert take(db, "b:2", now + 60 * S + LEASE * S)
    # The first holder has lost it: its renewals and its finish change nothing.
    assert not renew(db, "a:1", now + 200 * S)
    run_in_transaction(db.factory, partial(finish_run, name="watchdog", holder="a:1",
                                           now=now + 201 * S, summary="late"))
    assert not take(db, "c:3", now + 202 * S)


def test_a_finished_turn_waits_for_its_interval(db: Database, now: datetime) -> None:
    assert take(db, "a:1", now)
    run_in_transaction(db.factory, partial(finish_run, name="watchdog", holder="a:1",
                                           now=now + S, summary="ok"))
    assert not renew(db, "a:1", now + 2 * S)
    assert not take(db, "b:2", now + 30 * S, force=False)
    assert take(db, "b:2", now + 60 * S, force=False)


def test_a_turn_cut_short_is_due_once_its_lease_passed(db: Database, now: datetime) -> None:
    """An agent killed mid-turn: the next process takes the loop after the lease, not after
    the loop's interval (an hour here)."""
    def due(holder: str, at: datetime) -> bool:
        return run_in_transaction(db.factory, partial(
            start_run, name="purge", holder=holder, now=at, interval=3600, lease=LEASE,
            force=False))

    assert due("a:1", now)
    assert not due("b:2", now + (LEASE - 1) * S)
    assert due("b:2", now + LEASE * S)
    # Finished, it waits for its interval again.
    run_in_transaction(db.factory, partial(finish_run, name="purge", holder="b:2",
                                           now=now + (LEASE + 1) * S, summary="ok"))
    assert not due("c:3", now + (2 * LEASE + 5) * S)
