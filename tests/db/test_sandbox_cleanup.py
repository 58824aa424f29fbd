"""The sandbox records and the cleanup loop, on every database and in both stores: what the
retention period removes and what it keeps, and usage per VO."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from agents.context import AgentContext
from pilot.archive import Member, pack, sandbox_id
from taskqueue.core.settings import Settings
from taskqueue.db.models import Job
from taskqueue.files.sandboxes import (
    INPUT,
    OUTPUT,
    Uploader,
    find_sandbox,
    job_sandboxes,
    reference,
    register_sandbox,
    usage_by_vo,
)
from taskqueue.files.sandboxstore import open_store
from tests.conftest import Database
from tests.helpers import requirements, submit

ALICE = Uploader("lhcb", "alice", "lhcb_user")
DAY = timedelta(days=1)


def _store(db: Database, settings: Settings, name: str, now: datetime) -> str:
    data = pack([Member(name, name.encode())])
    sid = sandbox_id(data)
    open_store(settings).put(sid, data)
    with db.factory.begin() as session:
        register_sandbox(session, sid, len(data), ALICE, now=now)
    return sid


def _end(db: Database, job_id: int, status: str, at: datetime) -> None:
    with db.factory.begin() as session:
        session.execute(update(Job).where(Job.id == job_id).values(status=status, ended_at=at))


def test_cleanup_removes_only_what_the_retention_period_expired(
        db: Database, sandbox_settings: Settings, now: datetime) -> None:
    settings = sandbox_settings
    store = open_store(settings)
    old = now - 10 * DAY
    unused = _store(db, settings, "unused", old)
    running = _store(db, settings, "running", old)
    ended_long_ago = _store(db, settings, "ended-long-ago", old)
    ended_recently = _store(db, settings, "ended-recently", old)
    fresh = _store(db, settings, "fresh", now - timedelta(hours=1))
    with db.factory.begin() as session:
        jobs = submit(session, settings, old, [requirements()] * 3)
        reference(session, [(jobs[0], running)], INPUT)
        reference(session, [(jobs[1], ended_long_ago)], INPUT)
        reference(session, [(jobs[2], ended_recently)], OUTPUT)
    _end(db, jobs[0], "Running", old)
    _end(db, jobs[1], "Done", now - 8 * DAY)
    _end(db, jobs[2], "Failed", now - 2 * DAY)

    from agents.sandboxcleanup import clean_up_sandboxes

    ctx = AgentContext(settings, db.factory, clock=lambda: now)
    summary = clean_up_sandboxes(ctx, store, batch=1)
    assert summary.startswith("2 sandbox(es) removed")
    with db.factory() as session:
        kept = {s for s in (unused, running, ended_long_ago, ended_recently, fresh)
                if find_sandbox(session, s) is not None}
        assert job_sandboxes(session, jobs[1], INPUT) == []
        assert job_sandboxes(session, jobs[2], OUTPUT) == [ended_recently]
    assert kept == {running, ended_recently, fresh}
    assert store.size(unused) is None and store.size(ended_long_ago) is None
    assert all(store.size(s) for s in kept)
    assert sorted(store.keys()) == sorted(kept)
    assert clean_up_sandboxes(ctx, store).startswith("0 sandbox(es) removed")


def test_usage_per_vo_counts_a_shared_sandbox_in_each_vo(db: Database, now: datetime) -> None:
    data = pack([Member("a", b"a")])
    sid = sandbox_id(data)
    with db.factory.begin() as session:
        assert register_sandbox(session, sid, len(data), ALICE, now=now) is False
        assert register_sandbox(session, sid, len(data), ALICE, now=now) is True
        register_sandbox(session, sid, len(data), Uploader("belle", "bo", "belle_user"),
                         now=now)
        register_sandbox(session, sid, len(data), Uploader("lhcb", "bob", "lhcb_user"),
                         now=now)
    with db.factory() as session:
        usage = {(u.vo, u.sandboxes, u.bytes) for u in usage_by_vo(session)}
    assert usage == {("belle", 1, len(data)), ("lhcb", 1, len(data))}


def test_cleanup_sweeps_stored_objects_that_no_record_names(
        db: Database, sandbox_settings: Settings, now: datetime) -> None:
    from agents.sandboxcleanup import clean_up_sandboxes

    settings = sandbox_settings
    store = open_store(settings)
    later = datetime.now(UTC) + timedelta(seconds=settings.sandboxes.retention + 60)
    recorded = _store(db, settings, "recorded", later)  # not expired at ``later``
    orphan = pack([Member("orphan", b"left by a failed upload")])
    store.put(sandbox_id(orphan), orphan)
    # Young, it may be an upload through a presigned URL that is not recorded yet.
    ctx = AgentContext(settings, db.factory, clock=lambda: datetime.now(UTC))
    assert clean_up_sandboxes(ctx, store).endswith("0 unrecorded object(s) swept")
    assert store.size(sandbox_id(orphan)) == len(orphan)
    ctx = AgentContext(settings, db.factory, clock=lambda: later)
    assert clean_up_sandboxes(ctx, store, batch=1).endswith("1 unrecorded object(s) swept")
    assert store.size(sandbox_id(orphan)) is None
    assert store.size(recorded) is not None


def test_the_store_is_swept_once_per_sweep_interval(
        db: Database, sandbox_settings: Settings) -> None:
    """The sweep lists every stored object: the loop's turns in between skip it, and the
    first turn after the interval sweeps what was left meanwhile."""
    from agents.sandboxcleanup import SweepClock, clean_up_sandboxes

    settings = sandbox_settings
    store = open_store(settings)
    start = datetime.now(UTC) + timedelta(seconds=settings.sandboxes.retention + 60)
    clock = [start]
    ctx = AgentContext(settings, db.factory, clock=lambda: clock[0])
    sweeps = SweepClock(3600)
    assert clean_up_sandboxes(ctx, store, sweeps=sweeps).endswith("0 unrecorded object(s) swept")
    orphan = pack([Member("orphan", b"left by a failed upload meanwhile")])
    store.put(sandbox_id(orphan), orphan)
    clock[0] = start + timedelta(seconds=3599)
    assert clean_up_sandboxes(ctx, store, sweeps=sweeps).endswith("no store sweep due")
    assert store.size(sandbox_id(orphan)) == len(orphan)
    clock[0] = start + timedelta(seconds=3600)
    assert clean_up_sandboxes(ctx, store, sweeps=sweeps).endswith(
        "1 unrecorded object(s) swept")
    assert store.size(sandbox_id(orphan)) is None
