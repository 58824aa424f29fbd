"""SubmitPools in the database: store, map to queues, look up by queue, clean up."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select

from taskqueue.core.settings import Settings
from taskqueue.db.models import SubmitPool, SubmitPoolQueue
from taskqueue.queues.submitpools import (
    delete_unused_submit_pools,
    get_submit_pools_for_queue,
    set_pool_queues,
    store_submit_pool,
    submit_pool_id,
)
from tests.conftest import Database
from tests.helpers import claim, requirements, submit

REQ = {"SoftwareTag": ["gauss", "boole"], "Memory": 4000}


def test_store_is_idempotent_and_keeps_the_canonical_text(db: Database, now: datetime) -> None:
    later = now + timedelta(hours=1)
    with db.factory.begin() as s:
        a = store_submit_pool(s, REQ, now=now)
    with db.factory.begin() as s:
        b = store_submit_pool(s, {"Memory": 4000.0, "SoftwareTag": ["boole", "gauss"]}, now=later)
    assert a == b == submit_pool_id(REQ)
    with db.factory() as s:
        pool = s.get(SubmitPool, a)
    assert pool is not None
    assert pool.requirements == '{"Memory":4000,"SoftwareTag":["boole","gauss"]}'
    assert pool.created_at == now and pool.updated_at == later


def test_pools_for_a_queue(db: Database, now: datetime) -> None:
    with db.factory.begin() as s:
        p1 = store_submit_pool(s, REQ, now=now)
        p2 = store_submit_pool(s, {"GPU": 1}, now=now)
        set_pool_queues(s, p1, [("LCG.CERN.cern", "ce1.cern.ch", "long"),
                                ("LCG.RAL.uk", "arc.ral.ac.uk", "grid")], now=now)
        set_pool_queues(s, p2, [("LCG.CERN.cern", "ce1.cern.ch", "long")], now=now)
    with db.factory() as s:
        assert get_submit_pools_for_queue(s, "LCG.CERN.cern", "ce1.cern.ch", "long") == sorted(
            [p1, p2])
        assert get_submit_pools_for_queue(s, "LCG.RAL.uk", "arc.ral.ac.uk", "grid") == [p1]
        assert get_submit_pools_for_queue(s, "LCG.RAL.uk", "arc.ral.ac.uk", "other") == []
    refreshed = now + timedelta(minutes=15)
    with db.factory.begin() as s:  # the refresh replaces the mapping and stamps it
        set_pool_queues(s, p1, [("LCG.RAL.uk", "arc.ral.ac.uk", "grid")], now=refreshed)
    with db.factory() as s:
        assert get_submit_pools_for_queue(s, "LCG.CERN.cern", "ce1.cern.ch", "long") == [p2]
        stamps = set(s.scalars(select(SubmitPoolQueue.refreshed_at)
                               .where(SubmitPoolQueue.pool_id == p1)))
    assert stamps == {refreshed}


def test_cleanup_keeps_pools_with_pending_jobs_and_honours_grace(
        db: Database, settings: Settings, now: datetime) -> None:
    grace = timedelta(hours=1)
    with db.factory.begin() as s:
        used = store_submit_pool(s, REQ, now=now)
        idle = store_submit_pool(s, {"GPU": 1}, now=now)
        set_pool_queues(s, idle, [("S", "C", "Q")], now=now)
        submit(s, settings, now, [requirements(submit_pool=used)])
    with db.factory.begin() as s:
        assert delete_unused_submit_pools(s, now=now + grace / 2, grace=grace) == []
    with db.factory.begin() as s:
        assert delete_unused_submit_pools(s, now=now + grace, grace=grace) == [idle]
        assert get_submit_pools_for_queue(s, "S", "C", "Q") == []  # mapping went with it
    # once its job has left for a pilot, the used pool goes too, queue and all
    with db.factory.begin() as s:
        assert len(claim(s, now, submit_pools=[used])) == 1
    with db.factory.begin() as s:
        assert delete_unused_submit_pools(s, now=now + grace, grace=grace) == [used]
        assert s.scalars(select(SubmitPool.id)).all() == []
