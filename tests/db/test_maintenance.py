"""Maintenance loops on every database: SubmitPool refresh after a configuration change,
fair-share recomputation, and cleanup of empty task queues and unused SubmitPools with and
without their grace period."""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from agents.context import AgentContext
from agents.maintenance import clean_up, recompute_shares, refresh_submit_pools
from optimizers.chain import Identity, submissions_from_text, submit
from taskqueue.core.settings import ResourcesSettings, Settings
from taskqueue.db.models import Job, SubmitPool, SubmitPoolQueue, TaskQueue
from taskqueue.queues.submitpools import get_submit_pools_for_queue, store_submit_pool
from tests.conftest import Database
from tests.helpers import claim, requirements
from tests.helpers import submit as submit_jobs

REPO = Path(__file__).resolve().parents[2]
ME = Identity("lhcb", "alice", "lhcb_user")
NEWSOFT_JDL = '[ Executable = "run.sh"; Requirements = [ SoftwareTag = "VO-lhcb-newsoft" ] ]'
DEMO = ("DIRAC.Demo.local", "localhost", "local")
RAL = ("LCG.RAL.uk", "arc-ce02.gridpp.rl.ac.uk", "grid")
DEMO_HEADER = '[Sites."DIRAC.Demo.local".CEs.localhost.Queues.local]\n'
RAL_HEADER = '[Sites."LCG.RAL.uk".CEs."arc-ce02.gridpp.rl.ac.uk".Queues.grid]\n'
NEWSOFT = 'SoftwareTag = ["VO-lhcb-newsoft"]\n'


@dataclass
class Clock:
    at: datetime

    def __call__(self) -> datetime:
        return self.at


@pytest.fixture()
def resources_file(tmp_path: Path) -> Path:
    path = tmp_path / "resources.toml"
    shutil.copy(REPO / "conf" / "resources.toml", path)
    return path


def rewrite(path: Path, old: str, new: str) -> None:
    """Edit the resources file, and give it a new modification time whatever the file
    system's timestamp resolution (the context reads the file again when that changes)."""
    text = path.read_text(encoding="utf-8")
    assert old in text
    before = path.stat().st_mtime_ns
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    os.utime(path, ns=(before + 10**9, before + 10**9))


def make_context(db: Database, settings: Settings, resources: Path, at: datetime
                 ) -> tuple[AgentContext, Clock]:
    clock = Clock(at)
    cfg = replace(settings, resources=ResourcesSettings(file=str(resources)))
    return AgentContext(settings=cfg, factory=db.factory, clock=clock), clock


def pools_at(db: Database, queue: tuple[str, str, str]) -> list[str]:
    with db.factory() as s:
        return get_submit_pools_for_queue(s, *queue)


def refresh_stamps(db: Database, pool_id: str) -> set[datetime]:
    with db.factory() as s:
        return set(s.scalars(select(SubmitPoolQueue.refreshed_at)
                             .where(SubmitPoolQueue.pool_id == pool_id)))


# -- SubmitPool refresh ------------------------------------------------------------------------

def test_refresh_follows_a_configuration_change(db: Database, settings: Settings, now: datetime,
                                                resources_file: Path) -> None:
    rewrite(resources_file, DEMO_HEADER, DEMO_HEADER + NEWSOFT)  # one queue offers it
    ctx, clock = make_context(db, settings, resources_file, now)
    with db.factory.begin() as s:
        result = submit(s, submissions_from_text(NEWSOFT_JDL, "jdl"), ME, ctx.chain_context())
    (job_id,) = result.waiting
    with db.factory() as s:
        pool_id = s.scalar(select(Job.submit_pool).where(Job.id == job_id))
    assert pool_id is not None
    assert pools_at(db, DEMO) == [pool_id] and pools_at(db, RAL) == []
    assert refresh_stamps(db, pool_id) == {now}

    # A second queue gains the parameter: the refresh makes it eligible.
    rewrite(resources_file, RAL_HEADER, RAL_HEADER + NEWSOFT)
    clock.at = later = now + timedelta(minutes=15)
    summary = refresh_submit_pools(ctx)
    assert summary.startswith("1 SubmitPools refreshed")
    assert pools_at(db, RAL) == [pool_id] and pools_at(db, DEMO) == [pool_id]
    assert refresh_stamps(db, pool_id) == {later}

    # The first queue loses it: the pool disappears from that queue.
    rewrite(resources_file, DEMO_HEADER + NEWSOFT, DEMO_HEADER)
    clock.at = latest = later + timedelta(minutes=15)
    refresh_submit_pools(ctx)
    assert pools_at(db, DEMO) == [] and pools_at(db, RAL) == [pool_id]
    assert refresh_stamps(db, pool_id) == {latest}
    with db.factory() as s:  # the job keeps its pool and still waits
        job = s.get(Job, job_id)
        assert job is not None and (job.status, job.submit_pool) == ("Waiting", pool_id)


def test_refresh_uses_the_vos_of_the_pools_jobs(db: Database, settings: Settings,
                                                now: datetime, resources_file: Path) -> None:
    """belle's software at CERN is in the site's VOs.belle section: a pool of belle jobs is
    eligible there, the same requirements for an lhcb job are not."""
    ctx, _ = make_context(db, settings, resources_file, now)
    belle = {"SoftwareTag": "VO-belle-basf2-release-08"}
    with db.factory.begin() as s:
        pool_id = store_submit_pool(s, belle, now=now)
        submit_jobs(s, settings, now, [requirements(vo="belle", owner_group="belle_user",
                                                    submit_pool=pool_id)])
        stray = store_submit_pool(s, {"SoftwareTag": "nobody-has-this"}, now=now)
    summary = refresh_submit_pools(ctx)
    with db.factory() as s:
        rows = {(r.site, r.ce, r.queue) for r in s.execute(
            select(SubmitPoolQueue.site, SubmitPoolQueue.ce, SubmitPoolQueue.queue)
            .where(SubmitPoolQueue.pool_id == pool_id))}
    assert rows == {("LCG.CERN.cern", "ce503.cern.ch", "condor"),
                    ("LCG.CERN.cern", "ce503.cern.ch", "condor_short")}
    # A pool no job uses is not evaluated; it is kept until its grace period is over.
    assert summary == ("1 SubmitPools refreshed (0 with no eligible queue), 1 without jobs "
                       "skipped, 0 unused deleted")
    with db.factory() as s:
        assert s.get(SubmitPool, stray) is not None


def test_refresh_of_a_pool_whose_jobs_all_left_it_pending(
        db: Database, settings: Settings, now: datetime, resources_file: Path) -> None:
    """A pool whose jobs are all Matched (none pending) is still refreshed, for the VOs of
    those jobs: a job rescheduled soon after must find its pool's queues up to date."""
    ctx, clock = make_context(db, settings, resources_file, now)
    with db.factory.begin() as s:
        pool_id = store_submit_pool(s, {"SoftwareTag": "VO-belle-basf2-release-08"}, now=now)
        submit_jobs(s, settings, now, [requirements(vo="belle", owner_group="belle_user",
                                                    submit_pool=pool_id)])
        assert len(claim(s, now, vo="belle", submit_pools=[pool_id])) == 1
    clock.at = later = now + timedelta(minutes=15)
    assert refresh_submit_pools(ctx).startswith("1 SubmitPools refreshed")
    assert refresh_stamps(db, pool_id) == {later}
    assert pools_at(db, ("LCG.CERN.cern", "ce503.cern.ch", "condor")) == [pool_id]


def test_refresh_drops_unused_pools_after_the_grace(db: Database, settings: Settings,
                                                    now: datetime, resources_file: Path) -> None:
    grace = timedelta(seconds=settings.taskqueue.submit_pool_grace)
    ctx, clock = make_context(db, settings, resources_file, now)
    with db.factory.begin() as s:
        unused = store_submit_pool(s, {"SoftwareTag": "VO-lhcb-gauss-v50"}, now=now)
    clock.at = now + grace - timedelta(minutes=1)
    refresh_submit_pools(ctx)
    with db.factory() as s:
        assert s.get(SubmitPool, unused) is not None
    clock.at = now + grace + timedelta(minutes=1)
    assert refresh_submit_pools(ctx).endswith("1 unused deleted")
    with db.factory() as s:
        assert s.get(SubmitPool, unused) is None


def test_refresh_of_many_pools_in_small_batches(db: Database, settings: Settings,
                                                now: datetime, resources_file: Path) -> None:
    ctx, clock = make_context(db, settings, resources_file, now)
    tags = ["VO-lhcb-gauss-v50", "VO-lhcb-davinci-v46", "VO-lhcb-moore-v55",
            "VO-lhcb-gauss-v50-aarch64"]
    with db.factory.begin() as s:
        pools = {(t, ram): store_submit_pool(s, {"SoftwareTag": t, "MaxRAM": ram}, now=now)
                 for t in tags for ram in (1000, 3000)}
        submit_jobs(s, settings, now, [requirements(submit_pool=p) for p in pools.values()])
    clock.at = later = now + timedelta(minutes=15)
    assert refresh_submit_pools(ctx, batch=3).startswith("8 SubmitPools refreshed")
    for pool_id in pools.values():
        assert refresh_stamps(db, pool_id) == {later}
    # RAL has lhcb's x86 software, not the aarch64 build; its arc-ce02 has 2048 MB.
    assert pools_at(db, RAL) == sorted(pools[(t, 1000)] for t in tags[:3])
    assert pools_at(db, ("LCG.CERN.cern", "ce-arm01.cern.ch", "arm64")) == sorted(
        pools[(tags[3], ram)] for ram in (1000, 3000))


# -- fair share ------------------------------------------------------------------------------

def test_recompute_shares_applies_new_shares(db: Database, settings: Settings, now: datetime,
                                             resources_file: Path) -> None:
    with db.factory.begin() as s:
        submit_jobs(s, settings, now, [requirements(owner_group="g1"),
                                       requirements(owner_group="g2")], rng=random.Random(1))
    cfg = replace(settings, taskqueue=replace(settings.taskqueue, shares={"g1": 3.0}))
    ctx, _ = make_context(db, cfg, resources_file, now)
    assert recompute_shares(ctx) == "1 task queue priorities changed"
    with db.factory() as s:
        prios = {r.owner_group: r.priority
                 for r in s.execute(select(TaskQueue.owner_group, TaskQueue.priority))}
    assert prios == pytest.approx({"g1": 3.0, "g2": 1.0})
    assert recompute_shares(ctx) == "0 task queue priorities changed"


# -- cleanup ---------------------------------------------------------------------------------

def test_empty_queues_are_deleted_after_their_grace(db: Database, settings: Settings,
                                                    now: datetime, resources_file: Path) -> None:
    grace = timedelta(seconds=settings.taskqueue.empty_queue_grace)
    with db.factory.begin() as s:
        submit_jobs(s, settings, now, [requirements(owner="bob"), requirements(owner="carol")])
        claim(s, now, owner="bob")  # bob's queue is empty now, carol's still holds a job
    ctx, clock = make_context(db, settings, resources_file, now)
    assert clean_up(ctx).startswith("0 empty task queues deleted")
    clock.at = now + grace - timedelta(seconds=30)
    assert clean_up(ctx).startswith("0 empty task queues deleted")
    with db.factory() as s:
        assert set(s.scalars(select(TaskQueue.owner))) == {"bob", "carol"}
    clock.at = now + grace + timedelta(seconds=30)
    assert clean_up(ctx).startswith("1 empty task queues deleted")
    with db.factory() as s:
        assert list(s.scalars(select(TaskQueue.owner))) == ["carol"]
    clock.at = now + 100 * grace  # a queue with a job stays, however old
    assert clean_up(ctx).startswith("0 empty task queues deleted")


def test_unused_pools_are_deleted_after_their_grace(db: Database, settings: Settings,
                                                    now: datetime, resources_file: Path) -> None:
    grace = timedelta(seconds=settings.taskqueue.submit_pool_grace)
    with db.factory.begin() as s:
        empty = store_submit_pool(s, {"SoftwareTag": "a"}, now=now)
        pending = store_submit_pool(s, {"SoftwareTag": "b"}, now=now)
        started = store_submit_pool(s, {"SoftwareTag": "c"}, now=now)
        submit_jobs(s, settings, now, [requirements(owner="p", submit_pool=pending),
                                       requirements(owner="m", submit_pool=started)])
        claim(s, now, owner="m", submit_pools=[started])  # no longer pending
    ctx, clock = make_context(db, settings, resources_file, now + grace - timedelta(minutes=1))
    assert clean_up(ctx).endswith("0 unused SubmitPools deleted")
    with db.factory() as s:
        assert sorted(s.scalars(select(SubmitPool.id))) == sorted([empty, pending, started])
    clock.at = now + grace + timedelta(minutes=1)
    assert clean_up(ctx).endswith("2 unused SubmitPools deleted")
    with db.factory() as s:
        left = list(s.scalars(select(SubmitPool.id)))
    assert left == [pending]
    clock.at = now + 100 * grace  # a pool with a pending job stays, however old
    assert clean_up(ctx).endswith("0 unused SubmitPools deleted")
    with db.factory() as s:
        assert list(s.scalars(select(SubmitPool.id))) == [pending]
