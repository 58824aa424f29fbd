"""What a pilot is handed of a job's description is stored with the job (job_payloads) when
the description is read, on every database: a submission stores it for each of its jobs, the
match hands it back with the claimed job (the claim function's statement on PostgreSQL, one
statement after the procedure on MariaDB, the Python path's read elsewhere), a job stored
without it (before migration 0042) is matched with none and answered from its text, a
rescheduled job keeps its own, the optimizer stores the missing ones, and the purge removes
it with its job."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, update

from matcher.pilots import payload
from optimizers.chain import (
    ChainContext,
    Identity,
    optimize_received,
    submissions_from_text,
    submit,
)
from optimizers.description import payload_json
from optimizers.resources import parse_resources
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db.models import job_payloads_table, jobs_table
from taskqueue.pilots.pilotmatch import claimed_at, match_for_pilot
from taskqueue.queues.jobcontrol import reschedule_job
from taskqueue.queues.jobs import store_payloads
from taskqueue.queues.purge import purge_batch
from taskqueue.queues.taskqueues import remove_jobs_from_queues
from tests.conftest import Database
from tests.db.test_chain import GRID
from tests.helpers import requirements
from tests.helpers import submit as submit_plain

ME = Identity("lhcb", "alice", "lhcb_user")
MARKED = '[Executable = "run.sh"; Arguments = "%j"; JobName = "j%j"]'
PARAMETRIC = '[Executable = "p"; Arguments = "%s"; Parameters = {"a", "b"}]'


@pytest.fixture()
def ctx(now: datetime) -> ChainContext:
    return ChainContext(Settings(), parse_resources(GRID, "test-grid.toml"), now,
                        random.Random(5))


def _stored(db: Database) -> dict[int, str]:
    with db.factory() as s:
        return {r.job_id: r.payload for r in s.execute(select(job_payloads_table))}


def _submit(db: Database, ctx: ChainContext, text: str) -> list[int]:
    with db.factory.begin() as s:
        result = submit(s, submissions_from_text(text, "jdl"), ME, ctx)
    return sorted(result.waiting)


def test_a_submission_stores_each_job_s_payload(db: Database, ctx: ChainContext) -> None:
    [marked] = _submit(db, ctx, MARKED)
    bulk = _submit(db, ctx, PARAMETRIC)
    stored = _stored(db)
    assert set(stored) == {marked, *bulk}
    [sub] = submissions_from_text(MARKED, "jdl")
    assert stored[marked] == payload_json(sub.description, marked)
    assert f'"arguments":["{marked}"]' in stored[marked]
    assert ['"arguments":["a"]' in stored[bulk[0]], '"arguments":["b"]' in stored[bulk[1]]] \
        == [True, True]


def test_the_match_hands_back_the_stored_payload(db: Database, settings: Settings,
                                                 now: datetime) -> None:
    with db.factory.begin() as s:
        old = submit_plain(s, settings, now, [requirements()] * 3)
    with db.factory.begin() as s:  # two of them get a payload; the third is an old row
        store_payloads(s, [(old[0], '{"executable":"a"}'), (old[1], '{"executable":"b"}')],
                       new=True)
    resource = parse_resource({"vo": "lhcb", "pilot_reference": "pilot-1"})
    answer = match_for_pilot(db.matches, resource, now=now, count=3, rng=random.Random(1))
    assert [(j.id, j.payload) for j in answer.jobs] == [
        (old[0], '{"executable":"a"}'), (old[1], '{"executable":"b"}'), (old[2], None)]
    assert payload(answer.jobs[2]).executable == "x"  # read from its text
    assert [(j.id, j.payload) for j in claimed_at(db.matches, "lhcb", "pilot-1", now)] == [
        (j.id, j.payload) for j in answer.jobs]


def test_a_rescheduled_job_keeps_its_payload_and_old_ones_get_theirs(
        db: Database, settings: Settings, ctx: ChainContext, now: datetime) -> None:
    [job] = _submit(db, ctx, MARKED)
    before = _stored(db)[job]
    with db.factory.begin() as s:
        old = submit_plain(s, settings, now, [requirements()])[0]
    with db.factory.begin() as s:
        remove_jobs_from_queues(s, [job, old], now=now)
        for job_id in (job, old):
            s.execute(update(jobs_table).where(jobs_table.c.id == job_id).values(
                status=JobStatus.RUNNING.value))
            reschedule_job(s, job_id, by="test", now=now, reason="test", max_reschedules=5,
                           fail_when_exhausted=True)
        result = optimize_received(s, ctx, job_ids=[job, old])
    assert sorted(result.waiting) == sorted([job, old])
    stored = _stored(db)
    assert stored[job] == before
    assert stored[old] == '{"executable":"x","arguments":[],"environment":{},' \
        '"cpu_time":86400,"processors":1,"memory":0,"gpus":0,"input_sandbox":[],' \
        '"output_sandbox":[],"stdout":null,"stderr":null,"stdin":null,"job_name":null,' \
        '"container_image":null,"extra":{},"token_scopes":[]}'


def test_the_purge_removes_the_payload_with_its_job(db: Database, ctx: ChainContext,
                                                    now: datetime) -> None:
    kept, gone = _submit(db, ctx, PARAMETRIC)
    with db.factory.begin() as s:
        s.execute(update(jobs_table).where(jobs_table.c.id == gone).values(
            status=JobStatus.DONE.value, ended_at=now - timedelta(days=30)))
    with db.factory.begin() as s:
        purge_batch(s, status=JobStatus.DONE.value, before=now, limit=10)
    assert set(_stored(db)) == {kept}

