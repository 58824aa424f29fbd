"""The matcher's entry point, taskqueue.pilots.pilotmatch.match_for_pilot: on PostgreSQL the
database's claim function (migration 0014) does the common claim in one call; what it hands
back (expression queues, sites with limits) goes through the Python path. The matching rules
themselves run through both entry points in test_matching_rules, test_queues, test_grid_ce and
test_concurrency; here: what the function itself must get right, and what a hostile pilot or
a failing database does to it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, select, text, update
from sqlalchemy.orm import sessionmaker

from taskqueue.core.errors import ConflictError, DatabaseUnavailableError
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine
from taskqueue.db.models import Job, JobStatusHistory, TaskQueue, TaskQueueJob
from taskqueue.matching.limits import (
    NO_MATCH_LIMITS,
    NO_MATCH_NO_JOB,
    NO_MATCH_SITE_BANNED,
    LimitSpec,
    ban_site,
    set_limit,
)
from taskqueue.pilots.pilotmatch import (
    SERVER_CLAIMS,
    MatchAnswer,
    MatchDatabase,
    claimed_at,
    match_for_pilot,
)
from tests.conftest import BACKENDS, Database
from tests.helpers import claim, requirements, submit

#: The function's own failures: PostgreSQL's here, MariaDB's procedure's in
#: test_claim_procedure_mariadb, the Python path's in test_timeouts and test_database_errors.
ONLY_POSTGRESQL = (pytest.mark.parametrize("database", ["postgresql"], indirect=True)
                   if "postgresql" in BACKENDS else
                   pytest.mark.skip(reason="GRIDPILOT_TEST_POSTGRES_URL is not set"))


def match(db: Database, now: datetime, count: int = 1, **resource: Any) -> MatchAnswer:
    resource.setdefault("vo", "lhcb")
    resource.setdefault("pilot_reference", "pilot-1")
    return match_for_pilot(db.matches, parse_resource(resource), now=now, count=count)


def on_server(db: Database) -> bool:
    """Whether this backend's matches go through a claim function."""
    return db.engine.dialect.name in SERVER_CLAIMS


@pytest.fixture()
def session_statements(db: Database) -> Iterator[list[str]]:
    """The statements run through the sessions' engine (the Python path) while the test runs."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


def test_a_plain_claim_is_one_call_and_records_what_the_python_path_does(
        db: Database, settings: Settings, now: datetime,
        session_statements: list[str]) -> None:
    with db.factory.begin() as s:
        first, second = submit(s, settings, now, [requirements(sites=["A"])] * 2,
                               priorities=[5, 3])
    session_statements.clear()
    answer = match(db, now, site="A", ce="ce1.a.org", pilot_reference="p-fn")
    if on_server(db):
        assert session_statements == []  # nothing went through SQLAlchemy's sessions
    with db.factory.begin() as s:
        (c,) = claim(s, now + timedelta(seconds=1), site="A", ce="ce1.a.org",
                     pilot_reference="p-py")
    assert [j.id for j in answer.jobs] == [first] and c.job_id == second
    job = answer.jobs[0]
    assert (job.vo, job.owner, job.owner_group, job.job_type, job.description_format,
            job.bulk_index) == ("lhcb", "alice", "lhcb_user", "User", "jdl", None)
    assert job.description == '[Executable = "x"]'
    with db.factory() as s:
        rows = {r.id: r for r in s.execute(
            select(Job.id, Job.status, Job.minor_status, Job.pilot_reference, Job.site,
                   Job.ce, Job.heartbeat_at))}
        history = s.execute(select(JobStatusHistory.job_id, JobStatusHistory.status,
                                   JobStatusHistory.minor_status, JobStatusHistory.source,
                                   JobStatusHistory.at)
                            .where(JobStatusHistory.status == "Matched")
                            .order_by(JobStatusHistory.job_id)).all()
        left = s.scalar(select(TaskQueueJob.job_id))
        queue = s.execute(select(TaskQueue.draw_clock, TaskQueue.draw_key)).one()
    by_function, by_python = rows[first], rows[second]
    assert by_function[1:6] == ("Matched", "Assigned to pilot", "p-fn", "A", "ce1.a.org")
    assert by_python[1:6] == ("Matched", "Assigned to pilot", "p-py", "A", "ce1.a.org")
    assert by_function.heartbeat_at == now
    assert [tuple(h)[:4] for h in history] == [
        (first, "Matched", "Assigned to pilot", "matcher"),
        (second, "Matched", "Assigned to pilot", "matcher")]
    assert history[0].at == now
    assert left is None
    assert queue.draw_clock < queue.draw_key  # the clock advanced by both claims


def test_several_jobs_in_one_call_each_from_a_fresh_draw(db: Database, settings: Settings,
                                                         now: datetime) -> None:
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements(owner=f"u{i % 3}") for i in range(9)])
    answer = match(db, now, count=5, site=["A", "B"])
    assert len(answer.jobs) == 5 and len({c.tq_id for c in answer.claims}) >= 2
    assert [j.id for j in answer.jobs] == sorted(c.job_id for c in answer.claims)
    with db.factory() as s:
        sites = set(s.scalars(select(Job.site).where(Job.status == "Matched")))
    assert sites == {None}  # a pilot naming two sites records none
    rest = match(db, now, count=10)
    assert sorted(j.id for j in answer.jobs + rest.jobs) == sorted(ids)
    empty = match(db, now)
    assert (empty.jobs, empty.reason) == ([], NO_MATCH_NO_JOB)
    with db.factory() as s:  # both queues found empty and retired
        assert set(s.scalars(select(TaskQueue.active))) == {0}


HOSTILE_LABELS = ['a"b', "c\\d", "e,f", "{g}", "NULL", "h i", "ünï", "'j'", "[k]", '{"l": 1}']


@pytest.mark.parametrize("label", HOSTILE_LABELS)
def test_labels_with_quotes_commas_and_braces_match_exactly(
        db: Database, settings: Settings, now: datetime, label: str) -> None:
    with db.factory.begin() as s:
        (job,) = submit(s, settings, now, [requirements(
            sites=[label], platforms=[label], tags=[label], job_type=label,
            owner_group=label)])
    near = label[:-1] or "x"
    for field in ("site", "platform", "tags", "job_type", "owner_group"):
        offer: dict[str, Any] = {"site": label, "platform": label, "tags": [label],
                                 "job_type": label,
                 "owner_group": label, field: near}
        assert match(db, now, **offer).jobs == [], field
    answer = match(db, now, site=label, platform=label, tags=[label], required_tags=[label],
                   job_type=[label, near], owner_group=[near, label])
    assert [j.id for j in answer.jobs] == [job]


def test_banned_sites_are_taken_out_or_refuse_the_pilot(db: Database, settings: Settings,
                                                        now: datetime) -> None:
    with db.factory.begin() as s:
        (job,) = submit(s, settings, now, [requirements()])
        ban_site(s, "lhcb", "A", reason="downtime", by="ops", now=now)
        ban_site(s, "lhcb", "B", reason="downtime", by="ops", now=now)
    refused = match(db, now, site=["B", "A"])
    assert (refused.jobs, refused.reason) == ([], NO_MATCH_SITE_BANNED)
    assert refused.detail == "site A, B is banned for VO lhcb"
    answer = match(db, now, site=["A", "C"])
    assert [j.id for j in answer.jobs] == [job]
    with db.factory() as s:  # the one site left is the job's
        assert s.scalar(select(Job.site).where(Job.id == job)) == "C"


def test_a_site_with_limits_goes_through_the_gated_path(db: Database, settings: Settings,
                                                        now: datetime) -> None:
    with db.factory.begin() as s:
        (user, prod) = submit(s, settings, now, [requirements(),
                                                 requirements(job_type="MCSimulation")])
        set_limit(s, "lhcb", LimitSpec(site="A", attribute="job_type", value="User",
                                       max_running=0), now=now)
    answer = match(db, now, count=5, site="A")
    assert [j.id for j in answer.jobs] == [prod]
    held = match(db, now, site="A")
    assert (held.jobs, held.reason) == ([], NO_MATCH_LIMITS)
    elsewhere = match(db, now, site="B")
    assert [j.id for j in elsewhere.jobs] == [user]


def test_an_expression_queue_is_evaluated_by_the_caller(db: Database, settings: Settings,
                                                        now: datetime) -> None:
    expression = "other.Memory > 4000"
    with db.factory.begin() as s:
        (held,) = submit(s, settings, now, [requirements(expression=expression)])
        plain = submit(s, settings, now, [requirements(owner="bob")] * 2)
    seen: list[str] = []

    def check(text: str) -> bool:
        seen.append(text)
        return True

    answer = match_for_pilot(db.matches, parse_resource({"vo": "lhcb", "pilot_reference": "p"}),
                             now=now, count=3, expression_check=check)
    assert sorted(j.id for j in answer.jobs) == sorted([held, *plain])
    assert seen == [expression]


def test_a_required_tag_no_queue_carries_answers_at_once(db: Database, settings: Settings,
                                                         now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(owner=f"u{i}", tags=["GPU"]) for i in range(20)])
    answer = match(db, now, tags=["GPU", "HighMem"], required_tags=["HighMem"])
    assert (answer.jobs, answer.reason) == ([], NO_MATCH_NO_JOB)
    with db.factory() as s:  # nothing was retired or drawn
        assert set(s.scalars(select(TaskQueue.active))) == {1}
        assert set(s.scalars(select(TaskQueue.draw_clock))) == {0.0}


def test_gpu_jobs_go_only_to_pilots_with_enough_free_gpus(db: Database, settings: Settings,
                                                          now: datetime) -> None:
    """A pilot that offers no GPUs (or says nothing of them) gets no job that needs one; one
    that offers two gets the 2-GPU job and the 1-GPU job, not the 4-GPU one."""
    with db.factory.begin() as s:
        one, two, _four = submit(s, settings, now, [requirements(gpus=n) for n in (1, 2, 4)])
    assert match(db, now, count=3).jobs == []
    assert match(db, now, count=3, gpus=0).jobs == []
    answer = match(db, now, count=3, gpus=2)
    assert sorted(j.id for j in answer.jobs) == [one, two]
    with db.factory() as s:
        assert sorted(s.scalars(select(TaskQueue.gpus))) == [1, 2, 4]


def test_a_job_that_left_waiting_under_its_queue_abandons_the_claim_and_changes_nothing(
        db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        (job,) = submit(s, settings, now, [requirements()])
        s.execute(update(Job).where(Job.id == job).values(status="Running"))
    with pytest.raises(ConflictError, match="no longer Waiting") as refused:
        match(db, now)
    assert f"job {job}" in str(refused.value)
    with db.factory() as s:
        assert s.scalar(select(TaskQueueJob.job_id)) == job  # still queued
        assert s.scalar(select(Job.status)) == "Running"
        assert s.scalar(select(TaskQueue.draw_clock)) == 0.0


def test_the_claims_of_many_threads_never_share_a_job(db: Database, settings: Settings,
                                                      now: datetime) -> None:
    n_jobs = 300 if db.is_server else 60
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements(owner=f"u{i % 7}") for i in range(n_jobs)])
    got: list[list[int]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def run(slot: int) -> None:
        try:
            while True:
                answer = match(db, now, count=1 + slot % 2, pilot_reference=f"t{slot}")
                if not answer.jobs:
                    return
                got[slot].extend(j.id for j in answer.jobs)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    everything = [job for slot in got for job in slot]
    assert sorted(everything) == sorted(ids)


@ONLY_POSTGRESQL
def test_a_hung_database_is_unavailable_not_a_hang(db: Database, settings: Settings,
                                                   now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements()])
    quick = make_engine(db.url, pool_size=1, autocommit=True, statement_timeout=0.5)
    blocker = db.engine.connect()
    try:
        blocker.execute(text("LOCK TABLE task_queue_jobs IN ACCESS EXCLUSIVE MODE"))
        with pytest.raises(DatabaseUnavailableError):
            match_for_pilot(MatchDatabase(db.factory, quick), parse_resource({"vo": "lhcb"}),
                            now=now)
    finally:
        blocker.rollback()
        blocker.close()
    answer = match_for_pilot(MatchDatabase(db.factory, quick),
                             parse_resource({"vo": "lhcb", "pilot_reference": "p"}), now=now)
    quick.dispose()
    assert len(answer.jobs) == 1  # the pooled connection is usable again


@ONLY_POSTGRESQL
def test_a_dropped_connection_is_replaced(db: Database, settings: Settings,
                                          now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements()] * 2)
    engine = make_engine(db.url, pool_size=1, autocommit=True)
    matches = MatchDatabase(db.factory, engine)
    assert len(match_for_pilot(matches, parse_resource({"vo": "lhcb", "pilot_reference": "p"}),
                               now=now).jobs) == 1
    with engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    with db.engine.begin() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    # Each request has a time of its own (the matcher's: the claim's key when it is read
    # back, test_a_claim_is_read_back_by_its_pilot_and_time).
    with pytest.raises(DatabaseUnavailableError):
        match_for_pilot(matches, parse_resource({"vo": "lhcb", "pilot_reference": "p"}),
                        now=now + timedelta(seconds=1))
    answer = match_for_pilot(matches, parse_resource({"vo": "lhcb", "pilot_reference": "p"}),
                             now=now + timedelta(seconds=2))
    engine.dispose()
    assert len(answer.jobs) == 1



def test_a_claim_is_read_back_by_its_pilot_and_time(db: Database, settings: Settings,
                                                    now: datetime) -> None:
    """What a claim stored is found again by (pilot, Matched, the request's time): the
    matcher's answer to a claim whose database went away before the answer came back."""
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(owner=f"u{i}") for i in range(4)])
    answer = match(db, now, count=2, pilot_reference="p-back")
    other = match(db, now + timedelta(seconds=1), count=1, pilot_reference="p-back")
    assert len(answer.jobs) == 2 and len(other.jobs) == 1
    assert claimed_at(db.matches, "lhcb", "p-back", now) == answer.jobs
    assert claimed_at(db.matches, "lhcb", "p-back", now + timedelta(seconds=1)) == other.jobs
    assert claimed_at(db.matches, "lhcb", "p-else", now) == []
    assert claimed_at(db.matches, "lhcb", "p-back", now + timedelta(seconds=2)) == []
    with db.factory.begin() as s:  # a confirmed job is the pilot's own business now
        s.execute(update(Job).where(Job.id == answer.jobs[0].id).values(status="Running"))
    assert claimed_at(db.matches, "lhcb", "p-back", now) == answer.jobs[1:]


def test_a_claim_cut_half_way_hands_over_what_it_stored(db: Database, settings: Settings,
                                                        now: datetime) -> None:
    """The claim function stores the plain queue's jobs and hands the expression queue to
    the Python path, whose database is unreachable (a failover under it): the pilot is given
    the jobs stored, which would otherwise wait Matched for the lease; it is refused only
    when nothing of its claim was stored. Never a job Matched to it that it did not get."""
    if not on_server(db):
        pytest.skip("SQLite claims in one transaction: nothing is stored half way")
    with db.factory.begin() as s:
        plain = submit(s, settings, now, [requirements(owner="bob")] * 3)
        submit(s, settings, now, [requirements(expression="other.Memory > 4000")])
        # The expression's queue comes last in the draw: the function claims the plain
        # queue's three jobs first, then hands the walk over.
        s.execute(update(TaskQueue).where(TaskQueue.expression.is_not(None))
                  .values(draw_key=10.0**9))
    unreachable = make_engine("postgresql+psycopg://nobody@127.0.0.1:9/none"
                              if db.backend == "postgresql" else
                              "mysql+pymysql://nobody@127.0.0.1:9/none", connect_timeout=1)
    cut = MatchDatabase(sessionmaker(unreachable), db.matches.autocommit)
    try:
        answer = match_for_pilot(cut, parse_resource({"vo": "lhcb", "pilot_reference": "p-cut"}),
                                 now=now, count=4, expression_check=lambda _text: True)
    finally:
        unreachable.dispose()
    with db.factory() as s:
        stored = sorted(s.scalars(select(Job.id).where(Job.pilot_reference == "p-cut",
                                                       Job.status == "Matched")))
    assert [j.id for j in answer.jobs] == stored == sorted(plain)
