"""The largest legal submissions on every database: 3,400 small JSON jobs in one list (64 KB)
and a parametric JDL of 10,000 jobs are stored in a few statements, each JSON job with its own
description (not the whole list, which made the PostgreSQL insert take minutes), with their
whole history; a refused bulk is a problem document and stores nothing."""

from __future__ import annotations

import json
from collections import Counter

from sqlalchemy import func, select

from optimizers.description import MAX_DESCRIPTION_BYTES, MAX_PARAMETRIC_JOBS
from taskqueue.db.models import Job, JobStatusHistory, TaskQueueJob
from tests.api.helpers import PILOT_REF, Api, assert_problem
from tests.conftest import Database

SMALL_JOB = {"executable": "a"}


def _largest_small_bulk() -> str:
    text = json.dumps([SMALL_JOB] * 3400, separators=(",", ":"))
    assert 60_000 < len(text) <= MAX_DESCRIPTION_BYTES
    return text


def _counts(db: Database) -> tuple[int, int, int]:
    with db.factory() as s:
        return (s.scalar(select(func.count()).select_from(Job)) or 0,
                s.scalar(select(func.count()).select_from(JobStatusHistory)) or 0,
                s.scalar(select(func.count()).select_from(TaskQueueJob)) or 0)


def test_3400_json_jobs_each_keep_their_own_description(client: Api, user_token: str,
                                                        db: Database) -> None:
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201,
                       text=_largest_small_bulk(), content_type="application/json")
    ids = answer["job_ids"]
    assert len(ids) == 3400 == len(set(ids))
    assert {(j["status"], j["minor_status"]) for j in answer["jobs"]} == {
        ("Waiting", "Pilot Agent Submission")}
    with db.factory() as s:
        texts = Counter(s.scalars(select(Job.description)))
        indexes = sorted(s.scalars(select(Job.bulk_index)))
        history = s.execute(select(JobStatusHistory.job_id, JobStatusHistory.status)
                            .order_by(JobStatusHistory.id)).all()
    assert texts == {'{"executable":"a"}': 3400}
    assert indexes == list(range(3400))
    by_job: dict[int, list[str]] = {}
    for job_id, status in history:
        by_job.setdefault(job_id, []).append(status)
    assert set(by_job) == set(ids)
    assert {tuple(v) for v in by_job.values()} == {("Received", "Checking", "Waiting")}
    assert _counts(db) == (3400, 3 * 3400, 3400)


def test_10000_parametric_jobs_are_stored_and_run(client: Api, user_token: str,
                                                  pilot_token: str, db: Database) -> None:
    jdl = (f'Executable = "/bin/echo"; Arguments = "run %n"; '
           f"Parameters = {MAX_PARAMETRIC_JOBS};")
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201, text=jdl)
    assert len(answer["job_ids"]) == MAX_PARAMETRIC_JOBS
    assert _counts(db) == (MAX_PARAMETRIC_JOBS, 3 * MAX_PARAMETRIC_JOBS, MAX_PARAMETRIC_JOBS)
    matched = client.match(pilot_token, count=3, pilot_reference=PILOT_REF)
    assert len(matched["jobs"]) == 3
    for job in matched["jobs"]:
        index = client.job(user_token, job["job_id"])["bulk_index"]
        # %n is zero-padded to the width of the last index, as DIRAC writes it.
        assert job["arguments"] == ["run", str(index).zfill(4)]


def test_a_mixed_bulk_fails_jobs_without_losing_the_others(client: Api, user_token: str,
                                                          db: Database) -> None:
    body = [SMALL_JOB, {"executable": "b", "attributes": {"custom_attributes": {
        "Requirements": {"SoftwareTag": "nope-v1"}}}}, SMALL_JOB]
    answer = client.ok("POST", "/api/v1/jobs", user_token, status=201, json_body=body)
    assert [j["status"] for j in answer["jobs"]] == ["Waiting", "Failed", "Waiting"]
    with db.factory() as s:
        failed = s.get(Job, answer["job_ids"][1])
        assert failed is not None and failed.ended_at is not None
        assert failed.minor_status == answer["jobs"][1]["minor_status"]
        statuses = list(s.scalars(select(JobStatusHistory.status)
                                  .where(JobStatusHistory.job_id == failed.id)
                                  .order_by(JobStatusHistory.id)))
    assert statuses == ["Received", "Checking", "Failed"]


def test_a_refused_bulk_is_a_problem_and_stores_nothing(client: Api, user_token: str,
                                                       db: Database) -> None:
    too_many = client.call("POST", "/api/v1/jobs", user_token,
                           text=f'Executable = "x"; Parameters = {MAX_PARAMETRIC_JOBS + 1};')
    assert_problem(too_many, 422, str(MAX_PARAMETRIC_JOBS))
    one_bad = client.call("POST", "/api/v1/jobs", user_token,
                          json_body=[SMALL_JOB] * 100 + [{"executable": 5}])
    assert_problem(one_bad, 422, "job 100")
    assert _counts(db) == (0, 0, 0)
