"""PostgreSQL: the claims that threads of one matcher process make at the same time run as a
group, one statement and one transaction (taskqueue.pilots.pilotmatch._run_group, through
taskqueue.db.groupcommit): each claim still follows its own pilot's description, a job is
claimed once, each claim from a queue advances its clock, and one claim's failure is its own.

A group is formed for certain, not by luck of timing: the first claim is held in the database
(a lock on the history table that its INSERT waits for) while the others queue behind it; they
then run together as the next group. The matching rules themselves, through the same entry
point, are tested on every backend in test_matching_rules, test_queues and test_concurrency.

Parametrised over the PostgreSQL backend alone; without a PostgreSQL server the module is
skipped with that reason (conftest makes a missing server an error when servers are required).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Connection, select, text, update

from taskqueue.core.errors import ConflictError, DatabaseUnavailableError
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine
from taskqueue.db.models import Base, Job, JobStatusHistory, TaskQueue, TaskQueueJob
from taskqueue.matching.limits import NO_MATCH_NO_JOB
from taskqueue.pilots import pilotmatch
from taskqueue.pilots.pilotmatch import GROUP_LANES, MatchAnswer, MatchDatabase, match_for_pilot
from tests.conftest import BACKENDS, Database
from tests.helpers import requirements, submit

if "postgresql" not in BACKENDS:
    pytest.skip("claim groups are PostgreSQL's: GRIDPILOT_TEST_POSTGRES_URL is not set",
                allow_module_level=True)

pytestmark = pytest.mark.parametrize("database", ["postgresql"], indirect=True)

#: How long a test waits for a thread before it calls the claim stuck (no timing assertion).
PATIENCE = 60.0

Outcome = MatchAnswer | BaseException


@pytest.fixture()
def matches(db: Database) -> Iterator[MatchDatabase]:
    """A matcher process's databases of its own, so that its groups are this test's, with
    one lane: the claims that queue behind a held claim are then the next group, whole (with
    more lanes, the next claims would take the free ones first)."""
    engine = make_engine(db.url, pool_size=2, autocommit=True)
    try:
        database = MatchDatabase(db.factory, engine)
        assert database.groups is not None
        database.groups.lanes = 1
        yield database
    finally:
        engine.dispose()


def claim_in_thread(matches: MatchDatabase, now: datetime, outcomes: dict[str, Outcome],
                    name: str, count: int = 1, seed: int | None = None,
                    **resource: Any) -> threading.Thread:
    resource = {"vo": "lhcb", "pilot_reference": name, **resource}

    def run() -> None:
        try:
            outcomes[name] = match_for_pilot(
                matches, parse_resource(resource), now=now, count=count,
                rng=random.Random(seed) if seed is not None else None)
        except BaseException as exc:  # the claim's answer, checked by the test
            outcomes[name] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def held_then_grouped(db: Database, matches: MatchDatabase, first: Any,
                      rest: list[Any], *, group_fails: bool = False) -> None:
    """Start ``first`` (a callable starting one claim thread) while the history table is
    locked, so that it waits in the database; once it holds the (one) lane, start the
    ``rest`` and wait until they queue behind it; release the lock and wait for every
    thread. Then: two groups ran, the held claim and all the rest; and the claims run alone
    were the held one, and all the rest as well when their group statement failed
    (``group_fails``), none of them otherwise."""
    assert matches.groups is not None
    groups, calls = matches.groups.groups, matches.groups.calls
    alone: list[object] = []
    run_alone = pilotmatch._outcome

    def counted(engine: Any, params: Any) -> Any:
        alone.append(params)
        return run_alone(engine, params)

    pilotmatch._outcome = counted
    blocker: Connection = db.engine.connect()
    try:
        blocker.execute(text("LOCK TABLE job_status_history IN SHARE MODE"))
        threads = [first()]
        for _ in range(int(PATIENCE * 100)):  # the first claim holds the lane: it leads
            if matches.groups.running == 1:
                break
            threading.Event().wait(0.01)
        assert matches.groups.running == 1, "the first claim did not start"
        threads += [start() for start in rest]
        for _ in range(int(PATIENCE * 100)):
            if matches.groups.queued == len(rest):
                break
            threading.Event().wait(0.01)
        assert matches.groups.queued == len(rest), "the claims did not queue"
    finally:
        blocker.rollback()
        blocker.close()
    try:
        for thread in threads:
            thread.join(PATIENCE)
            assert not thread.is_alive(), "a claim was left waiting"
    finally:
        pilotmatch._outcome = run_alone
    assert (matches.groups.groups - groups, matches.groups.calls - calls) == (2, 1 + len(rest))
    assert len(alone) == (1 + len(rest) if group_fails else 1)


def transaction_of(db: Database, job_ids: list[int]) -> set[str]:
    """The transactions that last wrote these jobs (their rows' xmin)."""
    with db.engine.connect() as conn:
        return {str(x) for x in conn.execute(
            text("SELECT xmin::text FROM jobs WHERE id = ANY(:ids)"), {"ids": job_ids}
        ).scalars()}


def jobs_of(outcome: Outcome) -> list[int]:
    assert isinstance(outcome, MatchAnswer), outcome
    return [job.id for job in outcome.jobs]


def test_a_group_claims_for_each_pilot_by_its_own_description_in_one_transaction(
        db: Database, settings: Settings, now: datetime, matches: MatchDatabase) -> None:
    with db.factory.begin() as s:
        a1, a2, a3 = submit(s, settings, now, [requirements(sites=["A"])] * 3)
        (b,) = submit(s, settings, now, [requirements(sites=["B"])])
        (c,) = submit(s, settings, now, [requirements(sites=["C"], owner="carol")])
        (belle,) = submit(s, settings, now, [requirements(vo="belle", owner_group="belle_user",
                                                          sites=["A"])])
    outcomes: dict[str, Outcome] = {}
    held_then_grouped(db, matches, lambda: claim_in_thread(matches, now, outcomes, "p0",
                                                           site="A"), [
        lambda: claim_in_thread(matches, now, outcomes, "pb", site="B"),
        lambda: claim_in_thread(matches, now, outcomes, "pa2", count=2, site="A"),
        lambda: claim_in_thread(matches, now, outcomes, "pc-wrong-owner", site="C",
                                owner="alice"),
        lambda: claim_in_thread(matches, now, outcomes, "pc", site="C", owner="carol"),
        lambda: claim_in_thread(matches, now, outcomes, "pd", site="D"),
        lambda: claim_in_thread(matches, now, outcomes, "pbelle", vo="belle", site="A"),
    ])
    assert jobs_of(outcomes["pb"]) == [b] and jobs_of(outcomes["pc"]) == [c]
    assert sorted(jobs_of(outcomes["p0"]) + jobs_of(outcomes["pa2"])) == [a1, a2, a3]
    assert jobs_of(outcomes["pbelle"]) == [belle]  # another VO's pilot: its VO's job only
    assert len(jobs_of(outcomes["pa2"])) == 2
    for empty in ("pc-wrong-owner", "pd"):
        answer = outcomes[empty]
        assert isinstance(answer, MatchAnswer)
        assert (answer.jobs, answer.reason) == ([], NO_MATCH_NO_JOB)
    grouped = (jobs_of(outcomes["pb"]) + jobs_of(outcomes["pa2"]) + jobs_of(outcomes["pc"])
               + jobs_of(outcomes["pbelle"]))
    assert len(transaction_of(db, grouped)) == 1  # one transaction, one commit
    assert transaction_of(db, grouped) != transaction_of(db, jobs_of(outcomes["p0"]))
    with db.factory() as s:
        rows = s.execute(select(Job.id, Job.status, Job.pilot_reference, Job.site)).all()
        assert {(r.id, r.status, r.pilot_reference, r.site) for r in rows} == {
            (jid, "Matched", name, site) for name, site in
            (("p0", "A"), ("pa2", "A"), ("pb", "B"), ("pc", "C"), ("pbelle", "A"))
            for jid in jobs_of(outcomes[name])}
        assert sorted(s.scalars(select(JobStatusHistory.job_id).where(
            JobStatusHistory.status == "Matched"))) == [a1, a2, a3, b, c, belle]
        assert s.scalar(select(TaskQueueJob.job_id)) is None


def _draw_key_after_three_claims(db: Database, settings: Settings, now: datetime,
                                 matches: MatchDatabase, grouped: bool) -> float:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements()] * 5, priorities=[3] * 5,
               rng=random.Random(7))
    outcomes: dict[str, Outcome] = {}
    if grouped:
        held_then_grouped(db, matches, lambda: claim_in_thread(
            matches, now, outcomes, "p0", seed=0), [
            (lambda i=i: claim_in_thread(matches, now, outcomes, f"p{i}", seed=i))
            for i in (1, 2)])
    else:
        for i in range(3):
            claim_in_thread(matches, now, outcomes, f"p{i}", seed=i).join(PATIENCE)
    assert all(len(jobs_of(outcomes[f"p{i}"])) == 1 for i in range(3))
    with db.factory() as s:
        key = s.scalar(select(TaskQueue.draw_key))
    assert key is not None
    with db.engine.begin() as conn:  # the next run starts from nothing, as this one did
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())
    return float(key)


def test_each_claim_of_a_group_advances_its_queue_s_clock(
        db: Database, settings: Settings, now: datetime, matches: MatchDatabase) -> None:
    alone = _draw_key_after_three_claims(db, settings, now, matches, grouped=False)
    grouped = _draw_key_after_three_claims(db, settings, now, matches, grouped=True)
    # The same three draws (seeded per pilot), in whatever order: the same key.
    assert grouped == pytest.approx(alone, rel=1e-9)
    assert alone > 0.0


def test_a_claim_that_fails_in_a_group_fails_alone(
        db: Database, settings: Settings, now: datetime, matches: MatchDatabase) -> None:
    with db.factory.begin() as s:
        (a,) = submit(s, settings, now, [requirements(sites=["A"])])
        (broken,) = submit(s, settings, now, [requirements(sites=["X"])])
        (b,) = submit(s, settings, now, [requirements(sites=["B"])])
        (c,) = submit(s, settings, now, [requirements(sites=["C"])])
        # Left its queue's list out of step: the claim from it must give up, changing nothing.
        s.execute(update(Job).where(Job.id == broken).values(status="Running"))
    outcomes: dict[str, Outcome] = {}
    held_then_grouped(db, matches, lambda: claim_in_thread(matches, now, outcomes, "pa",
                                                           site="A"), [
        lambda: claim_in_thread(matches, now, outcomes, "pb", site="B"),
        lambda: claim_in_thread(matches, now, outcomes, "px", site="X"),
        lambda: claim_in_thread(matches, now, outcomes, "pc", site="C"),
    ], group_fails=True)
    refused = outcomes["px"]
    assert isinstance(refused, ConflictError) and f"job {broken}" in str(refused)
    assert [jobs_of(outcomes[n]) for n in ("pa", "pb", "pc")] == [[a], [b], [c]]
    with db.factory() as s:
        assert s.scalar(select(TaskQueueJob.job_id)) == broken  # still queued
        assert s.scalar(select(Job.status).where(Job.id == broken)) == "Running"
        assert set(s.scalars(select(JobStatusHistory.job_id).where(
            JobStatusHistory.status == "Matched"))) == {a, b, c}


def test_a_group_on_a_hung_database_is_unavailable_for_each_pilot_and_claims_nothing(
        db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements()] * 4)
    quick = make_engine(db.url, pool_size=1, autocommit=True, statement_timeout=1.0)
    matches = MatchDatabase(db.factory, quick)
    assert matches.groups is not None
    outcomes: dict[str, Outcome] = {}
    blocker = db.engine.connect()
    try:
        blocker.execute(text("LOCK TABLE task_queue_jobs IN ACCESS EXCLUSIVE MODE"))
        threads = [claim_in_thread(matches, now, outcomes, f"p{i}") for i in range(4)]
        for thread in threads:
            thread.join(PATIENCE)
            assert not thread.is_alive(), "a claim was left waiting"
    finally:
        blocker.rollback()
        blocker.close()
    assert all(isinstance(outcomes[f"p{i}"], DatabaseUnavailableError) for i in range(4))
    assert matches.groups.calls == 4
    with db.factory() as s:
        assert set(s.scalars(select(Job.status))) == {"Waiting"}
        assert sorted(s.scalars(select(TaskQueueJob.job_id))) == sorted(ids)
    answer = match_for_pilot(matches, parse_resource({"vo": "lhcb", "pilot_reference": "p"}),
                             now=now)
    quick.dispose()
    assert len(answer.jobs) == 1  # the pool's connection serves again


def test_many_threads_of_one_process_claim_each_job_once(
        db: Database, settings: Settings, now: datetime, matches: MatchDatabase) -> None:
    with db.factory.begin() as s:
        ids = submit(s, settings, now, [requirements(owner=f"u{i % 5}", sites=[f"S{i % 3}"])
                                        for i in range(240)])
    assert matches.groups is not None
    matches.groups.lanes = GROUP_LANES  # as the matcher runs them
    got: list[list[int]] = [[] for _ in range(8)]
    errors: list[BaseException] = []

    def run(slot: int) -> None:
        try:
            while True:
                answer = match_for_pilot(
                    matches, parse_resource({"vo": "lhcb", "pilot_reference": f"t{slot}",
                                             "site": f"S{slot % 3}"}),
                    now=now, count=1 + slot % 3)
                if not answer.jobs:
                    return
                got[slot].extend(job.id for job in answer.jobs)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(PATIENCE * 5)
    assert errors == []
    everything = sorted(job for slot in got for job in slot)
    assert everything == sorted(ids)
    assert matches.groups is not None and matches.groups.calls >= 8


def test_a_group_carries_labels_of_any_character(
        db: Database, settings: Settings, now: datetime, matches: MatchDatabase) -> None:
    """The group's arguments travel in one statement (lists as array literals): a label
    with quotes, backslashes, commas, braces or any script reaches each claim as sent."""
    sites = ['LCG."Quoted".org', "LCG.Back\\slash.org", "LCG.Comma,}Brace{.org",
             "LCG.Ünïcødé.🚀", "LCG.plain.org"]
    with db.factory.begin() as s:
        ids = {site: submit(s, settings, now, [requirements(sites=[site], owner="o'hara")])[0]
               for site in sites}
    outcomes: dict[str, Outcome] = {}
    held_then_grouped(db, matches, lambda: claim_in_thread(
        matches, now, outcomes, "p-plain", site="LCG.plain.org", owner="o'hara"), [
        (lambda i=i, site=site: claim_in_thread(matches, now, outcomes, f"p{i}", site=site,
                                                owner="o'hara", platform=['el9"x', "a\\b"]))
        for i, site in enumerate(sites[:-1])])
    assert jobs_of(outcomes["p-plain"]) == [ids["LCG.plain.org"]]
    for i, site in enumerate(sites[:-1]):
        assert jobs_of(outcomes[f"p{i}"]) == [ids[site]], site
