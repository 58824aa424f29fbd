"""Submission stores exactly what storing the jobs Received and running the chain on them
stores: the same job rows, the same status history for each job, the same task-queue rows and
the same queue statistics (mean priority, jobs inserted, an inactive queue's reactivation with
its clock and key), on every database.

The submission path decides the chain in memory, locks the queues first (an active queue's
statistics folded in by one UPDATE) and writes the jobs, their history and their queue rows
with as few statements as the database allows; the stepwise path (:func:`optimize_received`,
the one ``gridpilot optimize`` and rescheduling use) stores the jobs Received, then moves them
status by status and computes each queue's statistics in Python. Both run from the same start
with the same seeded random draws, so every stored value must agree.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from optimizers.chain import (
    ChainContext,
    Identity,
    Submission,
    _basic_requirements,
    optimize_received,
    submissions_from_text,
    submit,
)
from optimizers.resources import parse_resources
from taskqueue.core.settings import Settings
from taskqueue.db.models import (
    Base,
    history_table,
    jobs_table,
    task_queues_table,
    tq_jobs_table,
    tq_sites_table,
)
from taskqueue.queues.jobs import NewJob, add_jobs
from taskqueue.queues.taskqueues import remove_jobs_from_queues
from tests.conftest import Database
from tests.db.test_chain import GRID

ME = Identity("lhcb", "alice", "lhcb_user")

def _json(*jobs: tuple[str, dict[str, Any]]) -> str:
    """A JSON bulk of jobs given as (executable, JDL fields)."""
    return json.dumps([{"executable": exe, "attributes": {"custom_attributes": fields}}
                       for exe, fields in jobs])


#: Two queues' worth of jobs (two CPU times, two priorities).
FIRST = _json(("a", {}), ("b", {"Priority": 2}), ("c", {"CPUTime": 90000, "Priority": 3}))
#: One more job for the first queue (active: its statistics fold in).
MORE = '[Executable = "d"; Priority = 4]'
#: One more job for the second queue, emptied and inactive by then (reactivated).
BACK = '[Executable = "e"; CPUTime = 90000; Priority = 5]'
#: A parametric bulk, a job no queue can run, and one at a site of its own.
MIXED = [
    ('[Executable = "p"; Arguments = "%n"; Parameters = 3; Priority = 2]', "jdl"),
    (_json(("f", {"Requirements": {"SoftwareTag": "nope-v1"}}),
           ("g", {"Site": ["S.B.org"], "Requirements": {"SoftwareTag": "gauss-v50"}})), "json"),
]

Store = Callable[[Database, ChainContext, list[Submission]], None]


def _fast(db: Database, ctx: ChainContext, subs: list[Submission]) -> None:
    with db.factory.begin() as s:
        submit(s, subs, ME, ctx)


def _stepwise(db: Database, ctx: ChainContext, subs: list[Submission]) -> None:
    with db.factory.begin() as s:
        ids = add_jobs(s, [NewJob(x.text, _basic_requirements(ME, x.description),
                                  x.description.priority, x.format, x.bulk_index,
                                  x.description.job_name, x.description.job_group)
                           for x in subs], now=ctx.now)
        optimize_received(s, ctx, limit=len(ids), job_ids=ids)


def _run(db: Database, store: Store, now: datetime) -> dict[str, Any]:
    """Submit the same sequence through ``store`` and return what the database holds."""
    grid = parse_resources(GRID, "test-grid.toml")
    ctx = ChainContext(Settings(), grid, now, random.Random(11))
    store(db, ctx, submissions_from_text(FIRST, "json"))
    with db.factory.begin() as s:  # the second queue runs dry and goes inactive
        second = list(s.scalars(select(tq_jobs_table.c.job_id).where(
            tq_jobs_table.c.tq_id == select(tq_jobs_table.c.tq_id)
            .where(tq_jobs_table.c.rank == -3).scalar_subquery())))
        remove_jobs_from_queues(s, second, now=now)
    later = ChainContext(ctx.settings, grid, now + timedelta(minutes=5), ctx.rng)
    if store is _fast:  # one request each
        store(db, later, submissions_from_text(MORE, "jdl"))
        store(db, later, submissions_from_text(BACK, "jdl"))
    else:  # both at once: the statistics of two queues computed together
        store(db, later, submissions_from_text(MORE, "jdl")
              + submissions_from_text(BACK, "jdl"))
    for text, fmt in MIXED:
        store(db, later, submissions_from_text(text, fmt))
    return _snapshot(db)


def _snapshot(db: Database) -> dict[str, Any]:
    with db.factory() as s:
        jobs = [r._asdict() for r in s.execute(select(jobs_table).order_by(jobs_table.c.id))]
        place = {job["id"]: n for n, job in enumerate(jobs)}
        history: dict[int, list[tuple[Any, ...]]] = {}
        for r in s.execute(select(history_table).order_by(history_table.c.id)):
            history.setdefault(place[r.job_id], []).append(
                (r.status, r.minor_status, r.source, r.at))
        queues = {r.id: r._asdict() for r in s.execute(select(task_queues_table))}
        digest = {tq_id: q.pop("digest") for tq_id, q in queues.items()}
        sites = sorted((digest[r.tq_id], r.value) for r in s.execute(select(tq_sites_table)))
        queued = sorted((place[r.job_id], digest[r.tq_id], r.rank)
                        for r in s.execute(select(tq_jobs_table)))
    for job in jobs:
        del job["id"]
    return {"jobs": jobs, "history": history, "queued": queued, "sites": sites,
            "queues": sorted((digest[i], {k: v for k, v in q.items() if k != "id"})
                             for i, q in queues.items())}


def _empty(db: Database) -> None:
    with db.engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())


def test_submission_stores_what_the_stepwise_chain_stores(db: Database, now: datetime) -> None:
    fast = _run(db, _fast, now)
    _empty(db)
    stepwise = _run(db, _stepwise, now)
    assert len(fast["jobs"]) == 10
    for key in ("jobs", "history", "queued", "sites", "queues"):
        assert fast[key] == stepwise[key], key
    # The scenario reaches what it means to: Failed and Waiting jobs, a SubmitPool, a
    # reactivated queue, and each job's history in order by id.
    statuses = [job["status"] for job in fast["jobs"]]
    assert statuses.count("Failed") == 1 and statuses.count("Waiting") == 9
    assert [job["ended_at"] is not None for job in fast["jobs"]] == [
        status == "Failed" for status in statuses]
    assert all([h[0] for h in hist][:2] == ["Received", "Checking"] and len(hist) == 3
               for hist in fast["history"].values())
    counts = sorted(q["jobs_inserted"] for _, q in fast["queues"])
    # The first queue holds six jobs; the second counts afresh (one) after it came back; the
    # job with a SubmitPool waits in a queue of its own.
    assert counts == [1, 1, 6]


@pytest.mark.parametrize("priorities", [[1, 1, 1], [1, 2, 7], [3]])
def test_an_active_queue_folds_new_jobs_into_its_mean_priority(
        db: Database, now: datetime, priorities: Sequence[int]) -> None:
    grid = parse_resources(GRID, "test-grid.toml")
    ctx = ChainContext(Settings(), grid, now, random.Random(3))
    _fast(db, ctx, submissions_from_text('[Executable = "x"; Priority = 2]', "jdl"))
    _fast(db, ctx, submissions_from_text('[Executable = "y"; Priority = 4]', "jdl"))
    body = _json(*(("z", {"Priority": p}) for p in priorities))
    _fast(db, ctx, submissions_from_text(body, "json"))
    with db.factory() as s:
        (queue,) = s.execute(select(task_queues_table)).all()
    n = 2 + len(priorities)
    assert queue.jobs_inserted == n
    assert queue.mean_job_priority == pytest.approx((2 + 4 + sum(priorities)) / n)
    assert queue.active == 1 and queue.emptied_at is None
