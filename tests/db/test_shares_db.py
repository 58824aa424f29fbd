"""Group shares set by operators (stored in the database), and the task-queue listings."""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select

from taskqueue.core.definitions import TaskQueueDefinition
from taskqueue.core.errors import InvalidInputError, NotFoundError
from taskqueue.core.settings import Settings, TaskQueueSettings
from taskqueue.db.models import GroupShare, Job, TaskQueue
from taskqueue.queues.jobcontrol import kill_job
from taskqueue.queues.shares import ShareEntry, reset_share, set_share, share_table, shares_in_force
from taskqueue.queues.taskqueues import queue_page, waiting_counts, waiting_definition
from tests.conftest import Database
from tests.helpers import claim, requirements, submit


@pytest.fixture()
def shared(settings: Settings) -> Settings:
    """Settings giving lhcb_user a share of 3 (lhcb_prod has the default, 1)."""
    return Settings(database=settings.database,
                    taskqueue=TaskQueueSettings(shares={"lhcb_user": 3.0, "lhcb_admin": 2.0}))


def priorities(db: Database) -> dict[tuple[str, int], float]:
    """(owner group, CPU-time bucket) → the queue's priority."""
    with db.factory() as s:
        return {(q.owner_group, q.cpu_time): q.priority for q in s.scalars(select(TaskQueue))}


def fill(db: Database, settings: Settings, now: datetime) -> dict[str, list[int]]:
    """Two lhcb_user queues (one owner) and one lhcb_prod queue."""
    with db.factory.begin() as s:
        user = submit(s, settings, now, [requirements(cpu_time=100), requirements(cpu_time=5000)]
                      * 30, rng=random.Random(1))
        prod = submit(s, settings, now, [requirements(owner_group="lhcb_prod", owner="p")] * 60,
                      rng=random.Random(2))
    return {"lhcb_user": user, "lhcb_prod": prod}


# -- shares ---------------------------------------------------------------------------------

def test_set_share_changes_the_priorities_at_once(db: Database, shared: Settings,
                                                  now: datetime) -> None:
    fill(db, shared, now)
    assert priorities(db) == pytest.approx({("lhcb_user", 360): 1.5, ("lhcb_user", 7200): 1.5,
                                            ("lhcb_prod", 360): 1.0})
    with db.factory.begin() as s:
        changed = set_share(s, shared, "lhcb", "lhcb_user", 8.0, by="operator", now=now)
        user_queues = set(s.scalars(select(TaskQueue.id)
                                    .where(TaskQueue.owner_group == "lhcb_user")))
    assert set(changed) == user_queues and list(changed.values()) == pytest.approx([4.0, 4.0])
    assert priorities(db) == pytest.approx({("lhcb_user", 360): 4.0, ("lhcb_user", 7200): 4.0,
                                            ("lhcb_prod", 360): 1.0})
    with db.factory() as s:
        table = share_table(s, shared, "lhcb")
        in_force = shares_in_force(s, shared, "lhcb")
        row = s.get(GroupShare, ("lhcb", "lhcb_user"))
    assert table == [ShareEntry("lhcb_admin", 2.0, "settings"),
                     ShareEntry("lhcb_user", 8.0, "operator")]
    assert in_force == {"lhcb_user": 8.0, "lhcb_admin": 2.0}
    assert row is not None and (row.updated_by, row.updated_at) == ("operator", now)


def test_set_share_again_replaces_it(db: Database, shared: Settings, now: datetime) -> None:
    fill(db, shared, now)
    later = now + timedelta(hours=1)
    with db.factory.begin() as s:
        set_share(s, shared, "lhcb", "lhcb_prod", 5.0, by="alice", now=now)
    with db.factory.begin() as s:
        set_share(s, shared, "lhcb", "lhcb_prod", 0.5, by="bob", now=later)
    assert priorities(db)[("lhcb_prod", 360)] == pytest.approx(0.5)
    with db.factory() as s:
        rows = [(r.owner_group, r.share, r.updated_by, r.updated_at)
                for r in s.scalars(select(GroupShare))]
        table = share_table(s, shared, "lhcb")
    assert rows == [("lhcb_prod", 0.5, "bob", later)]
    assert ShareEntry("lhcb_prod", 0.5, "operator") in table


def test_reset_share_returns_to_the_settings(db: Database, shared: Settings,
                                             now: datetime) -> None:
    fill(db, shared, now)
    with db.factory.begin() as s:
        set_share(s, shared, "lhcb", "lhcb_user", 10.0, by="operator", now=now)
        set_share(s, shared, "lhcb", "lhcb_prod", 4.0, by="operator", now=now)
    with db.factory.begin() as s:
        changed = reset_share(s, shared, "lhcb", "lhcb_user")
    assert list(changed.values()) == pytest.approx([1.5, 1.5])
    with db.factory.begin() as s:
        # not in the settings: the default share
        reset_share(s, shared, "lhcb", "lhcb_prod")
    assert priorities(db) == pytest.approx({("lhcb_user", 360): 1.5, ("lhcb_user", 7200): 1.5,
                                            ("lhcb_prod", 360): 1.0})
    with db.factory() as s:
        assert share_table(s, shared, "lhcb") == [ShareEntry("lhcb_admin", 2.0, "settings"),
                                          ShareEntry("lhcb_user", 3.0, "settings")]
        assert s.scalar(select(func.count()).select_from(GroupShare)) == 0
    with db.factory.begin() as s, pytest.raises(NotFoundError):
        reset_share(s, shared, "lhcb", "lhcb_user")


def test_share_of_a_group_without_queues(db: Database, shared: Settings,
                                         now: datetime) -> None:
    with db.factory.begin() as s:
        assert set_share(s, shared, "lhcb", "lhcb_calib", 2.5, by="operator", now=now) == {}
    with db.factory() as s:
        assert ShareEntry("lhcb_calib", 2.5, "operator") in share_table(s, shared, "lhcb")
    with db.factory.begin() as s:  # queues created later get the operator's share
        submit(s, shared, now, [requirements(owner_group="lhcb_calib", owner="c")])
    assert priorities(db) == pytest.approx({("lhcb_calib", 360): 2.5})


@pytest.mark.parametrize(("group", "share"), [
    ("lhcb_user", 0.0), ("lhcb_user", -1.0), ("lhcb_user", float("nan")),
    ("lhcb_user", float("inf")), ("", 1.0), ("   ", 1.0),
], ids=["zero", "negative", "nan", "infinite", "empty group", "blank group"])
def test_invalid_shares_are_refused(db: Database, shared: Settings, now: datetime,
                                    group: str, share: float) -> None:
    fill(db, shared, now)
    before = priorities(db)
    with db.factory.begin() as s, pytest.raises(InvalidInputError):
        set_share(s, shared, "lhcb", group, share, by="operator", now=now)
    with db.factory() as s:
        assert s.scalar(select(func.count()).select_from(GroupShare)) == 0
    assert priorities(db) == before


def test_the_draw_follows_a_new_share(db: Database, shared: Settings, now: datetime) -> None:
    groups = fill(db, shared, now)
    with db.factory.begin() as s:
        set_share(s, shared, "lhcb", "lhcb_prod", 1e6, by="operator", now=now)
    picks: Counter[str] = Counter()
    rng = random.Random(7)
    for _ in range(5):
        with db.factory.begin() as s:
            for c in claim(s, now, count=10, rng=rng, owner_group="ANY"):
                picks["lhcb_prod" if c.job_id in groups["lhcb_prod"] else "lhcb_user"] += 1
    # at most the one draw that was already due when the share changed goes to lhcb_user
    assert picks["lhcb_prod"] >= 49 and sum(picks.values()) == 50


# -- listings -------------------------------------------------------------------------------

def test_queue_page_counts_and_values(db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(sites=["B", "A"], banned_sites=["C"],
                                               platforms=["el9"], tags=["GPU"])] * 3)
        submit(s, settings, now, [requirements(owner="bob")] * 2)
        submit(s, settings, now, [requirements(vo="belle")] * 4)
        (c,) = claim(s, now, owner="bob")
    with db.factory() as s:
        page = queue_page(s, "lhcb")
        ids = [q.queue.id for q in page]
        assert [(q.queue.owner, q.waiting, q.values) for q in page] == [
            ("alice", 3, {"sites": ["A", "B"], "banned_sites": ["C"], "platforms": ["el9"],
                          "tags": ["GPU"]}),
            ("bob", 1, {}),
        ]
        assert [q.queue.id for q in queue_page(s, "lhcb", limit=1)] == ids[:1]
        assert [q.queue.id for q in queue_page(s, "lhcb", after=ids[0])] == ids[1:]
        assert queue_page(s, "lhcb", after=ids[1]) == []
        assert [q.waiting for q in queue_page(s, "belle")] == [4]
        assert queue_page(s, "atlas") == []
    assert c.tq_id == ids[1]


def test_an_emptied_queue_is_listed_with_no_waiting_job(db: Database, settings: Settings,
                                                        now: datetime) -> None:
    with db.factory.begin() as s:
        (job,) = submit(s, settings, now, [requirements()])
        kill_job(s, job, by="alice", now=now)
    with db.factory() as s:
        assert [q.waiting for q in queue_page(s, "lhcb")] == [0]
        assert waiting_counts(s, largest=10) == []


def test_waiting_counts(db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(owner="a")] * 2)
        submit(s, settings, now, [requirements(owner="b", job_type="MC")] * 5)
        submit(s, settings, now, [requirements(vo="belle", owner_group="belle_user")] * 3)
        submit(s, settings, now, [requirements(owner="c")] * 4)
        claim(s, now, count=2, owner="c")
    with db.factory() as s:
        counts = [(w.vo, w.owner_group, w.job_type, w.waiting)
                  for w in waiting_counts(s, largest=10)]
        top = [w.waiting for w in waiting_counts(s, largest=2)]
        total = s.scalar(select(func.count()).select_from(Job).where(Job.status == "Waiting"))
    assert counts == [("lhcb", "lhcb_user", "MC", 5), ("belle", "belle_user", "User", 3),
                      ("lhcb", "lhcb_user", "User", 2), ("lhcb", "lhcb_user", "User", 2)]
    assert top == [5, 3]
    assert sum(n for *_, n in counts) == total == 12


def test_waiting_definition(db: Database, settings: Settings, now: datetime) -> None:
    reqs = requirements(cpu_time=1000, processors=3, memory=3000, sites=["A"],
                        platforms=["el9"], tags=["GPU"], job_type="MC")
    with db.factory.begin() as s:
        waiting, matched = submit(s, settings, now, [reqs, requirements(owner="bob")])
        claim(s, now, owner="bob")
    with db.factory() as s:
        assert waiting_definition(s, waiting) == TaskQueueDefinition.for_job(reqs, settings)
        assert waiting_definition(s, matched) is None
        assert waiting_definition(s, 987654) is None
