"""Exactly once under concurrency: many processes claiming, many processes inserting."""

from __future__ import annotations

import multiprocessing
import random
import time
from collections import Counter
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select

from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine, make_session_factory, run_in_transaction
from taskqueue.db.models import Job, JobStatusHistory, TaskQueue, TaskQueueJob
from taskqueue.pilots.pilotmatch import MatchDatabase, match_for_pilot
from tests.conftest import CLAIM_ENTRIES, Database
from tests.helpers import claim, requirements, submit


def _claimer(url: str, pilot: str, start_at: float, entry: str = "claim_jobs") -> list[int]:
    """Claim until the queues are dry, through claim_jobs or the matcher's entry point
    (taskqueue.pilots.pilotmatch: the database's claim function on a server); return the ids this
    process got."""
    engine = make_engine(url, pool_size=1)
    factory = make_session_factory(engine)
    matches = MatchDatabase(factory, None if engine.dialect.name == "sqlite"
                            else make_engine(url, pool_size=1, autocommit=True))
    rng = random.Random(pilot)
    got: list[int] = []
    misses = 0
    time.sleep(max(0.0, start_at - time.time()))
    while misses < 3:
        count = rng.choice((1, 1, 2, 3))
        if entry == "match_for_pilot":
            claims = match_for_pilot(matches, parse_resource(
                {"vo": "lhcb", "pilot_reference": pilot, "owner_group": "ANY", "tags": "ANY"}),
                now=datetime.now(UTC), count=count, rng=rng).claims
        else:
            claims = run_in_transaction(factory, lambda s, n=count: claim(
                s, datetime.now(UTC), count=n, rng=rng, pilot_reference=pilot,
                owner_group="ANY", tags="ANY"))
        if claims:
            got.extend(c.job_id for c in claims)
            misses = 0
        else:
            misses += 1
            time.sleep(0.05)
    return got


def _inserter(url: str, worker: int, start_at: float) -> int:
    factory = make_session_factory(make_engine(url, pool_size=1))
    settings = Settings()
    time.sleep(max(0.0, start_at - time.time()))
    done = 0
    for batch in range(10):
        reqs = [requirements(owner=f"user{(worker + batch + i) % 10}") for i in range(50)]
        run_in_transaction(factory, lambda s, r=reqs: submit(s, settings, datetime.now(UTC), r))
        done += len(reqs)
    return done


def _spawn_pool(n: int) -> multiprocessing.pool.Pool:
    return multiprocessing.get_context("spawn").Pool(n)


@pytest.mark.slow
@pytest.mark.parametrize("entry", CLAIM_ENTRIES)
def test_every_job_claimed_exactly_once(db: Database, settings: Settings,
                                        now: datetime, entry: str) -> None:
    n_jobs, n_procs = (5000, 8) if db.is_server else (1500, 4)
    reqs = [requirements(owner=f"user{i % 40}", owner_group=f"g{i % 3}", cpu_time=i % 5000,
                         tags=["t"] if i % 7 == 0 else [])
            for i in range(n_jobs)]
    with db.factory.begin() as s:
        ids = submit(s, settings, now, reqs)
    start_at = time.time() + 4.0  # let every process connect before the race starts
    with _spawn_pool(n_procs) as pool:
        results = pool.starmap(_claimer, [(db.url, f"pilot-{i}", start_at, entry)
                                          for i in range(n_procs)], chunksize=1)
    claimed = [job for r in results for job in r]
    dupes = [job for job, n in Counter(claimed).items() if n > 1]
    assert dupes == [], f"{len(dupes)} jobs handed out twice"
    assert sorted(claimed) == sorted(ids), "some jobs were lost or left waiting"
    assert sum(1 for r in results if r) >= 2, "the claimers did not run concurrently"
    owner = {job: f"pilot-{i}" for i, r in enumerate(results) for job in r}
    with db.factory() as s:
        rows = s.execute(select(Job.id, Job.status, Job.pilot_reference)).all()
        matched_rows = s.execute(
            select(JobStatusHistory.job_id, func.count())
            .where(JobStatusHistory.status == "Matched").group_by(JobStatusHistory.job_id)
        ).all()
        left = s.scalar(select(func.count()).select_from(TaskQueueJob))
    assert {(r.id, r.status, r.pilot_reference) for r in rows} == {
        (job, "Matched", owner[job]) for job in ids}
    assert {n for _, n in matched_rows} == {1} and len(matched_rows) == n_jobs
    assert left == 0


@pytest.mark.slow
def test_concurrent_inserters_share_queues(db: Database) -> None:
    n_procs = 4
    start_at = time.time() + 3.0
    with _spawn_pool(n_procs) as pool:
        done = pool.starmap(_inserter, [(db.url, w, start_at) for w in range(n_procs)])
    assert sum(done) == 2000
    with db.factory() as s:
        queues = s.scalar(select(func.count()).select_from(TaskQueue))
        queued = s.scalar(select(func.count()).select_from(TaskQueueJob))
        waiting = s.scalar(select(func.count()).select_from(Job).where(Job.status == "Waiting"))
        inactive = s.scalar(select(func.count()).select_from(TaskQueue)
                            .where(TaskQueue.active == 0))
    assert (queues, queued, waiting, inactive) == (10, 2000, 2000, 0)


@pytest.mark.slow
@pytest.mark.parametrize("entry", CLAIM_ENTRIES)
def test_claims_racing_inserts_never_strand_a_job(db: Database, now: datetime,
                                                  entry: str) -> None:
    """A queue emptied by a claimer while an inserter fills it must stay active: the invariant
    "an inactive queue holds no job" is what makes a "no match" answer true."""
    start_at = time.time() + 4.0
    with _spawn_pool(6) as pool:
        inserts = [pool.apply_async(_inserter, (db.url, w, start_at)) for w in range(2)]
        claims = [pool.apply_async(_claimer, (db.url, f"pilot-{i}", start_at + 0.2, entry))
                  for i in range(4)]
        inserted = sum(r.get(timeout=300) for r in inserts)
        claimed = [job for r in claims for job in r.get(timeout=300)]
    with db.factory() as s:
        stranded = s.scalar(
            select(func.count()).select_from(TaskQueue)
            .where(TaskQueue.active == 0,
                   select(TaskQueueJob.job_id).where(TaskQueueJob.tq_id == TaskQueue.id)
                   .exists()))
    assert stranded == 0
    with db.factory.begin() as s:
        rest = claim(s, now, count=inserted, pilot_reference="sweeper")
    everything = claimed + [c.job_id for c in rest]
    assert len(everything) == len(set(everything)) == inserted == 1000
