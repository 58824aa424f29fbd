"""The dashboard's counters and snapshots (taskqueue.pilots.activity) on every backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select

from taskqueue.db.models import (
    history_table,
    job_counts_table,
    jobs_table,
    pilots_table,
    site_activity_table,
)
from taskqueue.pilots.activity import (
    DAY,
    HOUR,
    MINUTE,
    Retention,
    activity_series,
    epoch_minute,
    floor_time,
    latest_snapshot,
    recent_failures,
    record_activity,
    site_totals,
    status_series,
)
from taskqueue.pilots.sitestatus import queue_states, record_queue_status
from tests.conftest import Database

NOW = datetime(2026, 11, 22, 12, 0, 30, tzinfo=UTC)


def add_job(db: Database, *, status: str, site: str | None, vo: str = "lhcb",
            changes: tuple[tuple[str, datetime, str], ...] = ()) -> int:
    """A job and its history rows (status, time, minor status), as the claim and report paths
    leave them."""
    with db.engine.begin() as conn:
        job_id = int(conn.execute(insert(jobs_table).values(
            vo=vo, owner="alice", owner_group="lhcb_user", status=status, minor_status="",
            description="[]", description_format="jdl", job_type="User", user_priority=1,
            cpu_time=0, processors=1, memory=0, site=site, submitted_at=NOW - timedelta(days=3),
            reschedule_count=0)).inserted_primary_key[0])
        for change_status, at, minor in changes:
            conn.execute(insert(history_table).values(job_id=job_id, at=at, status=change_status,
                                                      minor_status=minor, source="test"))
    return job_id


def rows(db: Database, period: int) -> list[tuple[datetime, str, str, int, int, int]]:
    a = site_activity_table.c
    with db.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(  # type: ignore[misc]
            select(a.start, a.vo, a.site, a.matched, a.done, a.failed)
            .where(a.period == period).order_by(a.start, a.vo, a.site))]


def turn(db: Database, now: datetime, retention: Retention | None = None) -> None:
    with db.factory.begin() as session:
        record_activity(session, now=now, retention=retention or Retention())


@pytest.mark.parametrize("moment", [
    datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC), datetime(2026, 11, 22, 12, 0, 59, 999999,
                                                           tzinfo=UTC),
    datetime(1999, 12, 31, 23, 59, 30, 500000, tzinfo=UTC),
    datetime(2038, 1, 19, 3, 14, 8, tzinfo=UTC)])
def test_the_minute_function_agrees_with_python(db: Database, moment: datetime) -> None:
    add_job(db, status="Done", site="A", changes=(("Done", moment, ""),))
    with db.engine.connect() as conn:
        minute = conn.execute(select(epoch_minute(history_table.c.at))).scalar_one()
    assert datetime(1970, 1, 1, tzinfo=UTC) + timedelta(minutes=int(minute)) == floor_time(
        moment, MINUTE)


def test_matches_and_ends_are_counted_per_site_and_minute(db: Database) -> None:
    m0 = datetime(2026, 11, 22, 11, 58, 10, tzinfo=UTC)
    m1 = m0 + timedelta(minutes=1)
    for site in ("A", "A", "B"):
        add_job(db, status="Done", site=site, changes=(("Matched", m0, ""),
                                                      ("Running", m0, ""), ("Done", m1, "")))
    add_job(db, status="Failed", site="B", changes=(("Matched", m0, ""),
                                                   ("Failed", m1, "exit code 3")))
    add_job(db, status="Done", site="A", vo="belle", changes=(("Matched", m1, ""),))
    turn(db, NOW)
    assert rows(db, MINUTE) == [
        (floor_time(m0, MINUTE), "lhcb", "A", 2, 0, 0),
        (floor_time(m0, MINUTE), "lhcb", "B", 2, 0, 0),
        (floor_time(m1, MINUTE), "belle", "A", 1, 0, 0),
        (floor_time(m1, MINUTE), "lhcb", "A", 0, 2, 0),
        (floor_time(m1, MINUTE), "lhcb", "B", 0, 1, 1)]
    hour = floor_time(m0, HOUR)
    assert rows(db, HOUR) == [(hour, "belle", "A", 1, 0, 0), (hour, "lhcb", "A", 2, 2, 0),
                              (hour, "lhcb", "B", 2, 1, 1)]
    assert [r[1:] for r in rows(db, DAY)] == [r[1:] for r in rows(db, HOUR)]
    with db.factory() as session:
        totals = site_totals(session, "lhcb", since=NOW - timedelta(hours=1))
        assert (totals["B"].matched, totals["B"].done, totals["B"].failed) == (2, 1, 1)
        assert totals["B"].failure_rate == 0.5 and totals["A"].failure_rate == 0.0
        assert recent_failures(session, "lhcb", since=NOW - timedelta(hours=1)) == [
            ("exit code 3", 1)]
        assert recent_failures(session, "belle", since=NOW - timedelta(hours=1)) == []
        series = activity_series(session, "lhcb", since=m0, until=floor_time(NOW, MINUTE),
                                 period=MINUTE)
    assert series.lines == {"matched": [4, 0, 0], "done": [0, 3, 0], "failed": [0, 1, 0]}


def test_a_turn_again_changes_nothing_and_late_commits_are_caught(db: Database) -> None:
    m0 = datetime(2026, 11, 22, 11, 59, 10, tzinfo=UTC)
    add_job(db, status="Done", site="A", changes=(("Done", m0, ""),))
    turn(db, NOW)
    first = rows(db, MINUTE), rows(db, HOUR), rows(db, DAY)
    turn(db, NOW)
    assert (rows(db, MINUTE), rows(db, HOUR), rows(db, DAY)) == first
    # a change of 11:59 committed after the turn of 12:00:30 is counted by the next turn
    add_job(db, status="Done", site="A", changes=(("Done", m0, ""),))
    turn(db, NOW + timedelta(minutes=1))
    assert rows(db, MINUTE) == [(floor_time(m0, MINUTE), "lhcb", "A", 0, 2, 0)]
    assert rows(db, HOUR) == [(floor_time(m0, HOUR), "lhcb", "A", 0, 2, 0)]


def test_an_hour_keeps_its_minutes_counted_once_they_are_settled(db: Database) -> None:
    early = datetime(2026, 11, 22, 11, 5, tzinfo=UTC)
    add_job(db, status="Done", site="A", changes=(("Done", early, ""),))
    turn(db, early + timedelta(minutes=1))
    add_job(db, status="Done", site="A", changes=(("Done", NOW - timedelta(minutes=1), ""),))
    turn(db, NOW)  # 11:05 is long settled; its minute row still feeds the 11:00 hour
    assert rows(db, HOUR) == [(floor_time(early, HOUR), "lhcb", "A", 0, 2, 0)]


def test_a_rescheduled_job_is_counted_without_a_site(db: Database) -> None:
    add_job(db, status="Received", site=None,
            changes=(("Matched", NOW - timedelta(seconds=20), ""),))
    turn(db, NOW)
    assert rows(db, MINUTE) == [(floor_time(NOW, MINUTE), "lhcb", "", 1, 0, 0)]


def test_old_rows_are_pruned_per_tier(db: Database) -> None:
    retention = Retention(minutes=timedelta(hours=2), hours=timedelta(days=2),
                          days=timedelta(days=3))
    for days_ago in (5, 1):
        at = NOW - timedelta(days=days_ago)
        add_job(db, status="Done", site="A", changes=(("Done", at, ""),))
        turn(db, at + timedelta(seconds=30), retention)
    turn(db, NOW, retention)
    assert len(rows(db, MINUTE)) == 0  # both older than two hours
    assert [r[0] for r in rows(db, HOUR)] == [floor_time(NOW - timedelta(days=1), HOUR)]
    assert [r[0] for r in rows(db, DAY)] == [floor_time(NOW - timedelta(days=1), DAY)]
    c = job_counts_table.c
    with db.engine.connect() as conn:
        kept = sorted({(p, a) for p, a in conn.execute(select(c.period, c.at))})
    minute_now = floor_time(NOW, MINUTE)
    day_ago = floor_time(NOW - timedelta(days=1) + timedelta(seconds=30), MINUTE)
    assert kept == [(MINUTE, minute_now), (HOUR, day_ago), (HOUR, minute_now),
                    (DAY, day_ago), (DAY, minute_now)]


def test_snapshots_count_jobs_per_status_and_keep_the_first_of_each_hour(db: Database
                                                                         ) -> None:
    for status in ("Waiting", "Waiting", "Running", "Done"):
        add_job(db, status=status, site=None)
    add_job(db, status="Waiting", site=None, vo="belle")
    turn(db, NOW)
    add_job(db, status="Running", site=None)
    turn(db, NOW + timedelta(minutes=1))
    with db.factory() as session:
        snapshot = latest_snapshot(session, "lhcb")
        assert snapshot.at == floor_time(NOW + timedelta(minutes=1), MINUTE)
        assert snapshot.by_status == {"Waiting": 2, "Running": 2, "Done": 1}
        assert latest_snapshot(session, "belle").by_status == {"Waiting": 1}
        assert latest_snapshot(session, "cta").at is None
        minutes = status_series(session, "lhcb", since=NOW - timedelta(hours=1),
                                period=MINUTE, statuses=("Running", "Stalled"))
        hours = status_series(session, "lhcb", since=NOW - timedelta(hours=1), period=HOUR,
                              statuses=("Running",))
    assert minutes.lines == {"Running": [1, 2], "Stalled": [0, 0]}
    assert hours.lines == {"Running": [1]}  # the hour keeps its first snapshot


def add_pilot(db: Database, reference: str, status: str, place: tuple[str, str, str], *,
              seen: datetime, vo: str = "lhcb") -> None:
    with db.engine.begin() as conn:
        conn.execute(insert(pilots_table).values(
            reference=reference, vo=vo, site=place[0], ce=place[1], queue=place[2],
            status=status, submitted_at=seen - timedelta(hours=1), last_seen_at=seen,
            reason="", updated_at=seen))


def test_the_queue_snapshot_replaces_itself(db: Database) -> None:
    a, c = ("A", "ce-a", "q"), ("C", "ce-c", "q")
    add_pilot(db, "p1", "Running", a, seen=NOW - timedelta(minutes=1))
    add_pilot(db, "p2", "Running", a, seen=NOW - timedelta(minutes=3))
    add_pilot(db, "p3", "Done", a, seen=NOW - timedelta(hours=1))
    add_pilot(db, "p4", "Failed", a, seen=NOW - timedelta(days=2))
    add_pilot(db, "p5", "Waiting", c, seen=NOW - timedelta(minutes=9))
    add_pilot(db, "p6", "Running", a, seen=NOW, vo="belle")
    job = add_job(db, status="Running", site="A")
    with db.engine.begin() as conn:
        conn.execute(jobs_table.update().where(jobs_table.c.id == job).values(
            pilot_reference="p1"))
    outlook = {("lhcb", *a): (5, 2), ("lhcb", "B", "ce-b", "q"): (0, 0)}
    with db.factory.begin() as session:
        assert record_queue_status(session, now=NOW, outlook=outlook) == 4
    with db.factory() as session:
        states = {(q.site, q.ce, q.queue): q for q in queue_states(session, "lhcb")}
        assert [q.queue for q in queue_states(session, "belle")] == ["q"]
    assert sorted(states) == [a, ("B", "ce-b", "q"), c]
    first = states[a]
    assert (first.configured, first.running, first.waiting_for, first.task_queues) == (
        True, 1, 5, 2)
    assert first.pilots.alive == {"Running": 2} and first.pilots.ended == {"Done": 1}
    assert first.pilots.last_seen == NOW - timedelta(minutes=1)
    assert (states[c].configured, states[c].waiting_for, states[c].pilots.alive) == (
        False, None, {"Waiting": 1})
    assert states[("B", "ce-b", "q")].pilots.last_seen is None
    with db.factory.begin() as session:
        record_queue_status(session, now=NOW, outlook={})
    with db.factory() as session:
        assert [(q.site, q.configured) for q in queue_states(session, "lhcb")] == [
            ("A", False), ("C", False)]


def test_minutes_when_no_turn_ran_are_filled_from_the_history(db: Database) -> None:
    """The loop stopped for an hour: its next turn counts every minute since its last one."""
    add_job(db, status="Running", site="A", changes=(("Running", NOW, ""),))  # a snapshot
    turn(db, NOW)
    gap = [NOW + timedelta(minutes=m) for m in (5, 20, 50)]
    for at in gap:
        add_job(db, status="Done", site="A", changes=(("Matched", at, ""), ("Done", at, "")))
    add_job(db, status="Failed", site="A", changes=(("Failed", gap[1], "exit code 1"),))
    turn(db, NOW + timedelta(hours=1))
    assert rows(db, MINUTE) == [(floor_time(at, MINUTE), "lhcb", "A", 1, 1, int(at == gap[1]))
                                for at in gap]
    with db.factory() as session:
        totals = site_totals(session, "lhcb", since=NOW)
        assert (totals["A"].matched, totals["A"].done, totals["A"].failed) == (3, 3, 1)
        assert recent_failures(session, "lhcb", since=NOW) == [("exit code 1", 1)]
