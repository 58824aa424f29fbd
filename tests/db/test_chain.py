"""The optimizer chain end to end, on every database: from JDL/JSON text to Waiting (or Failed
with a reason), and the matching of what it produced."""

from __future__ import annotations

import random
from datetime import datetime

import pytest
from sqlalchemy import func, select

from optimizers.chain import (
    ChainContext,
    Identity,
    optimize_received,
    submissions_from_text,
    submit,
)
from optimizers.classads import expression_check
from optimizers.description import JobDescriptionError
from optimizers.queueresources import resource_for_queue
from optimizers.resources import ResourcesConfig, parse_resources
from taskqueue.core.definitions import JobRequirements
from taskqueue.core.settings import Settings
from taskqueue.db.models import Job, SubmitPool, TaskQueue
from taskqueue.matching.claim import claim_jobs
from taskqueue.queues.jobs import NewJob, add_jobs, job_history
from taskqueue.queues.submitpools import get_submit_pools_for_queue
from tests.conftest import Database

GRID = """
[JobDescription]
SoftwareTag = "list"
Platform = "list"
MaxRAM = "number"

[Sites."S.A.org"]
VO = ["lhcb"]
HS06 = 10.0
SoftwareTag = ["gauss-v50", "boole-v30"]
[Sites."S.A.org".CEs."ce.a.org".Queues.long]
MaxCPUTime = 2880
MaxRAM = 4000
Platform = "x86_64-el9"
[Sites."S.A.org".CEs."ce.a.org".Queues.short]
MaxCPUTime = 60
MaxRAM = 2000
Platform = "x86_64-el9"

[Sites."S.B.org"]
VO = ["lhcb"]
HS06 = 10.0
SoftwareTag = ["gauss-v50"]
[Sites."S.B.org".CEs."ce.b.org".Queues.grid]
MaxCPUTime = 2880
MaxRAM = 8000
Platform = "aarch64-el9"
"""

ME = Identity("lhcb", "alice", "lhcb_user")


@pytest.fixture()
def grid() -> ResourcesConfig:
    return parse_resources(GRID, "test-grid.toml")


@pytest.fixture()
def ctx(grid: ResourcesConfig, now: datetime) -> ChainContext:
    return ChainContext(Settings(), grid, now, random.Random(5))


def _submit(db: Database, ctx: ChainContext, text: str, fmt: str = "jdl") -> list[int]:
    subs = submissions_from_text(text, fmt)
    with db.factory.begin() as s:
        result = submit(s, subs, ME, ctx)
    return sorted(result.waiting + list(result.failed))


def _job(db: Database, job_id: int) -> Job:
    with db.factory() as s:
        job = s.get(Job, job_id)
    assert job is not None
    return job


def test_a_plain_jdl_waits_in_a_task_queue(db: Database, ctx: ChainContext) -> None:
    text = '[ Executable = "run.sh"; CPUTime = 3000; Priority = 4; MyOption = "x" ]'
    (job_id,) = _submit(db, ctx, text)
    job = _job(db, job_id)
    assert (job.status, job.minor_status) == ("Waiting", "Pilot Agent Submission")
    assert job.description == text and job.description_format == "jdl"
    assert job.user_priority == 4 and job.cpu_time == 3000
    with db.factory() as s:
        assert [h.status for h in job_history(s, job_id)] == ["Received", "Checking", "Waiting"]
        tq = s.scalars(select(TaskQueue)).one()
    assert (tq.cpu_time, tq.owner, tq.submit_pool) == (3600, "alice", None)


def test_parametric_jobs_expand_into_a_bulk(db: Database, ctx: ChainContext) -> None:
    ids = _submit(db, ctx, '[Executable = "run.sh"; Arguments = "%s"; Parameters = {"a", "b", '
                           '"c"}]')
    assert len(ids) == 3
    assert [_job(db, i).bulk_index for i in ids] == [0, 1, 2]
    assert {_job(db, i).status for i in ids} == {"Waiting"}


def test_json_submission(db: Database, ctx: ChainContext) -> None:
    (job_id,) = _submit(db, ctx, '{"executable": "/bin/true", "resources": '
                                 '{"process_count": 1, "cpu_cores_per_process": 4}}', "json")
    job = _job(db, job_id)
    assert (job.status, job.processors, job.description_format) == ("Waiting", 4, "json")


def test_requirements_make_a_submit_pool_and_restrict_sites(db: Database,
                                                            ctx: ChainContext) -> None:
    (job_id,) = _submit(db, ctx, '[Executable = "x"; Requirements = [SoftwareTag = "boole-v30";'
                                 ' MaxRAM = 3000]]')
    job = _job(db, job_id)
    assert job.status == "Waiting" and job.submit_pool is not None
    with db.factory() as s:
        assert s.get(SubmitPool, job.submit_pool) is not None
        assert get_submit_pools_for_queue(s, "S.A.org", "ce.a.org", "long") == [job.submit_pool]
        # short has too little memory, S.B.org lacks the software
        assert get_submit_pools_for_queue(s, "S.A.org", "ce.a.org", "short") == []
        assert get_submit_pools_for_queue(s, "S.B.org", "ce.b.org", "grid") == []
    # a pilot of the eligible queue gets the job; one of another queue does not
    for site, ce, queue, expected in (("S.B.org", "ce.b.org", "grid", []),
                                      ("S.A.org", "ce.a.org", "long", [job_id])):
        with db.factory.begin() as s:
            pools = get_submit_pools_for_queue(s, site, ce, queue)
            res = resource_for_queue(ctx.resources, site, ce, queue, "lhcb", submit_pools=pools,
                                     pilot_reference="p")
            assert [c.job_id for c in claim_jobs(s, res, now=ctx.now)] == expected


def test_requirements_no_queue_meets_fail_the_job(db: Database, ctx: ChainContext) -> None:
    (job_id,) = _submit(db, ctx, '[Executable = "x"; Requirements = [SoftwareTag = "nope-v1"]]')
    job = _job(db, job_id)
    assert job.status == "Failed"
    assert job.minor_status == "Requirements: no queue offers SoftwareTag 'nope-v1'"
    with db.factory() as s:
        assert s.scalar(select(func.count()).select_from(TaskQueue)) == 0


def test_sites_outside_the_eligible_ones_fail_the_job(db: Database, ctx: ChainContext) -> None:
    (job_id,) = _submit(db, ctx, '[Executable = "x"; Site = "S.B.org"; '
                                 'Requirements = [SoftwareTag = "boole-v30"]]')
    job = _job(db, job_id)
    assert job.status == "Failed"
    assert job.minor_status.startswith("Requirements: none of the sites the job may run at")
    assert "S.A.org" in job.minor_status


def test_a_glite_expression_is_evaluated_against_the_resource(db: Database,
                                                              ctx: ChainContext) -> None:
    (job_id,) = _submit(db, ctx, '[Executable = "x"; '
                                 'Requirements = other.MaxRAM >= 4000 && '
                                 'member("x86_64-el9", other.Platform)]')
    with db.factory() as s:
        tq = s.scalars(select(TaskQueue)).one()
    assert tq.expression == 'other.MaxRAM >= 4000 && member("x86_64-el9",other.Platform)'
    for queue, expected in (("short", []), ("long", [job_id])):
        res = resource_for_queue(ctx.resources, "S.A.org", "ce.a.org", queue, "lhcb",
                                 pilot_reference="p")
        with db.factory.begin() as s:
            got = claim_jobs(s, res, now=ctx.now, expression_check=expression_check(res))
        assert [c.job_id for c in got] == expected


def test_a_bad_description_stores_nothing(db: Database) -> None:
    with pytest.raises(JobDescriptionError, match="CPUTime must be a positive integer"):
        submissions_from_text('[Executable = "x"; CPUTime = "abc"]', "jdl")
    with db.factory() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 0


def test_the_loop_optimizes_stored_received_jobs(db: Database, ctx: ChainContext) -> None:
    good = '[Executable = "x"; Parameters = 2; JobName = "n%s"]'
    with db.factory.begin() as s:
        ids = add_jobs(s, [
            NewJob(good, JobRequirements("lhcb", "bob", "lhcb_user"), 1, "jdl", 1),
            NewJob("[Executable = 5]", JobRequirements("lhcb", "bob", "lhcb_user"), 1, "jdl"),
        ], now=ctx.now)
    with db.factory.begin() as s:
        result = optimize_received(s, ctx, limit=10)
    assert result.waiting == [ids[0]]
    assert list(result.failed) == [ids[1]]
    assert _job(db, ids[1]).minor_status == (
        "Job sanity: Executable must be a non-empty string, got 5")
    with db.factory.begin() as s:  # idempotent: nothing left to do
        again = optimize_received(s, ctx, limit=10)
    assert (again.waiting, again.failed) == ([], {})
