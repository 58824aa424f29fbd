"""The operators' controls on matching: the site mask and site limits, honoured by claims."""

from __future__ import annotations

import multiprocessing
import random
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from taskqueue.core.errors import InvalidInputError, NotFoundError
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.core.states import JobStatus
from taskqueue.db.database import make_engine, make_session_factory, run_in_transaction
from taskqueue.db.models import Job, SiteLimit, TaskQueueJob
from taskqueue.matching.claim import NO_EXCLUSIONS, Exclusions, claim_jobs, matching_queues
from taskqueue.matching.limits import (
    NO_MATCH_LIMITS,
    NO_MATCH_NO_JOB,
    NO_MATCH_SITE_BANNED,
    LimitSpec,
    MatchOutcome,
    ban_site,
    banned_among,
    claim_for_pilot,
    delete_limit,
    set_limit,
    site_bans,
    site_limits,
    unban_site,
)
from taskqueue.queues.jobcontrol import kill_job
from taskqueue.queues.jobs import apply_transition
from tests.conftest import Database
from tests.helpers import requirements, submit

SITE = "LCG.Alpha.org"
OTHER_SITE = "LCG.Beta.org"


def pilot_claim(session: Session, now: datetime, count: int = 1, **resource: Any
                ) -> MatchOutcome:
    resource.setdefault("vo", "lhcb")
    resource.setdefault("pilot_reference", "pilot-1")
    return claim_for_pilot(session, parse_resource(resource), now=now, count=count)


def claimed_ids(outcome: MatchOutcome) -> list[int]:
    return [c.job_id for c in outcome.claims]


def job_types(db: Database, ids: list[int]) -> Counter[str]:
    with db.factory() as s:
        return Counter(s.scalars(select(Job.job_type).where(Job.id.in_(ids))))


def finish(session: Session, job_id: int, now: datetime) -> None:
    apply_transition(session, [job_id], JobStatus.MATCHED, JobStatus.DONE,
                     minor_status="done", source="test", now=now)


# -- the site mask --------------------------------------------------------------------------

def test_banned_site_gets_no_job_until_unbanned(db: Database, settings: Settings,
                                               now: datetime) -> None:
    with db.factory.begin() as s:
        (job,) = submit(s, settings, now, [requirements()])
        ban_site(s, "lhcb", SITE, reason="downtime", by="operator", now=now)
    with db.factory.begin() as s:
        outcome = pilot_claim(s, now, site=SITE)
    assert outcome.claims == []
    assert outcome.reason == NO_MATCH_SITE_BANNED
    assert SITE in outcome.detail
    with db.factory() as s:
        assert s.get(Job, job).status == "Waiting"  # type: ignore[union-attr]
    with db.factory.begin() as s:
        unban_site(s, "lhcb", SITE)
        assert site_bans(s, "lhcb") == []
    with db.factory.begin() as s:
        outcome = pilot_claim(s, now, site=SITE)
    assert claimed_ids(outcome) == [job]
    assert outcome.reason is None
    with db.factory() as s:
        stored = s.get(Job, job)
    assert stored is not None and stored.status == "Matched" and stored.site == SITE


def test_a_ban_holds_only_its_site_and_its_vo(db: Database, settings: Settings,
                                             now: datetime) -> None:
    with db.factory.begin() as s:
        jobs = submit(s, settings, now, [requirements()] * 2)
        ban_site(s, "lhcb", SITE, reason="downtime", by="operator", now=now)
        ban_site(s, "belle", OTHER_SITE, reason="belle only", by="operator", now=now)
    with db.factory.begin() as s:
        first = pilot_claim(s, now, site=OTHER_SITE)  # banned for belle, not for lhcb
        second = pilot_claim(s, now)  # a pilot naming no site
    assert claimed_ids(first) + claimed_ids(second) == jobs
    with db.factory() as s:
        assert banned_among(s, "lhcb", frozenset({SITE, OTHER_SITE})) == {SITE}
        assert banned_among(s, "belle", frozenset({SITE, OTHER_SITE})) == {OTHER_SITE}
        assert banned_among(s, "lhcb", frozenset()) == frozenset()


def test_pilot_naming_two_sites_one_banned(db: Database, settings: Settings,
                                           now: datetime) -> None:
    with db.factory.begin() as s:
        at_banned, at_allowed = submit(s, settings, now, [
            requirements(owner="bob", sites=[OTHER_SITE]), requirements(sites=[SITE])])
        ban_site(s, "lhcb", OTHER_SITE, reason="downtime", by="operator", now=now)
    with db.factory.begin() as s:
        outcome = pilot_claim(s, now, count=5, site=[SITE, OTHER_SITE])
    assert claimed_ids(outcome) == [at_allowed]
    with db.factory() as s:
        stored = s.get(Job, at_allowed)
        assert stored is not None and stored.site == SITE
    with db.factory.begin() as s:
        outcome = pilot_claim(s, now, site=[SITE, OTHER_SITE])
    assert outcome.claims == [] and outcome.reason == NO_MATCH_NO_JOB
    with db.factory() as s:
        assert s.get(Job, at_banned).status == "Waiting"  # type: ignore[union-attr]


def test_ban_again_updates_the_reason_and_listing(db: Database, now: datetime) -> None:
    later = now + timedelta(hours=1)
    with db.factory.begin() as s:
        ban_site(s, "lhcb", SITE, reason="downtime", by="alice", now=now)
        ban_site(s, "lhcb", OTHER_SITE, reason="bad storage", by="alice", now=now)
        ban_site(s, "lhcb", SITE, reason="extended downtime", by="bob", now=later)
    with db.factory() as s:
        bans = [(b.site, b.reason, b.banned_by, b.banned_at) for b in site_bans(s, "lhcb")]
        assert site_bans(s, "belle") == []
    assert bans == [(SITE, "extended downtime", "bob", later),
                    (OTHER_SITE, "bad storage", "alice", now)]


def test_ban_and_unban_refusals(db: Database, now: datetime) -> None:
    with db.factory.begin() as s:
        with pytest.raises(InvalidInputError):
            ban_site(s, "lhcb", "  ", reason="x", by="op", now=now)
        with pytest.raises(NotFoundError):
            unban_site(s, "lhcb", SITE)
        ban_site(s, "belle", SITE, reason="x", by="op", now=now)
    with db.factory.begin() as s, pytest.raises(NotFoundError):
        unban_site(s, "lhcb", SITE)  # banned for belle only
    with db.factory() as s:
        assert [b.vo for b in site_bans(s, "belle")] == ["belle"]


# -- running limits -------------------------------------------------------------------------

def test_max_running_holds_the_rest_while_other_types_match(db: Database, settings: Settings,
                                                            now: datetime) -> None:
    with db.factory.begin() as s:
        mc = submit(s, settings, now, [requirements(job_type="MC")] * 5)
        user = submit(s, settings, now, [requirements(owner="bob")] * 2)
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", max_running=2), now=now)
    got: list[int] = []
    for _ in range(2):
        with db.factory.begin() as s:
            outcome = pilot_claim(s, now, site=SITE, job_type="MC")
        assert outcome.reason is None
        got += claimed_ids(outcome)
    assert set(got) <= set(mc) and len(set(got)) == 2
    with db.factory.begin() as s:
        held = pilot_claim(s, now, site=SITE, job_type="MC")
    assert held.claims == [] and held.reason == NO_MATCH_LIMITS
    # a pilot that can also run other job types still gets those
    with db.factory.begin() as s:
        outcome = pilot_claim(s, now, count=10, site=SITE)
    assert sorted(claimed_ids(outcome)) == sorted(user)
    with db.factory.begin() as s:
        held = pilot_claim(s, now, site=SITE)
    assert held.claims == [] and held.reason == NO_MATCH_LIMITS
    # the limit is per site: another site's pilot gets the remaining MC jobs
    with db.factory.begin() as s:
        elsewhere = pilot_claim(s, now, count=10, site=OTHER_SITE)
    assert sorted(claimed_ids(elsewhere)) == sorted(set(mc) - set(got))


def test_max_running_with_several_jobs_in_one_claim(db: Database, settings: Settings,
                                                    now: datetime) -> None:
    with db.factory.begin() as s:
        mc = submit(s, settings, now, [requirements(job_type="MC", owner=f"u{i % 3}")
                                       for i in range(8)])
        user = submit(s, settings, now, [requirements(owner="bob")] * 3)
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", max_running=3), now=now)
    with db.factory.begin() as s:
        outcome = pilot_claim(s, now, count=20, site=SITE)
    ids = claimed_ids(outcome)
    assert len(ids) == len(set(ids)) == 6
    assert job_types(db, ids) == Counter({"MC": 3, "User": 3})
    assert set(ids) >= set(user)
    with db.factory() as s:
        waiting_mc = s.scalar(select(func.count()).select_from(TaskQueueJob)
                              .where(TaskQueueJob.job_id.in_(mc)))
    assert waiting_mc == 5


def test_several_jobs_in_one_claim_stop_at_the_limit(db: Database, settings: Settings,
                                                     now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(job_type="MC")] * 6)
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", max_running=4), now=now)
    with db.factory.begin() as s:
        first = pilot_claim(s, now, count=3, site=SITE)
    with db.factory.begin() as s:
        second = pilot_claim(s, now, count=3, site=SITE)
    with db.factory.begin() as s:
        third = pilot_claim(s, now, count=3, site=SITE)
    assert (len(first.claims), len(second.claims), len(third.claims)) == (3, 1, 0)
    assert third.reason == NO_MATCH_LIMITS
    with db.factory() as s:
        at_site = s.scalar(select(func.count()).select_from(Job)
                           .where(Job.site == SITE, Job.status == "Matched"))
    assert at_site == 4


def test_max_running_zero_holds_every_job_of_the_value(db: Database, settings: Settings,
                                                       now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(owner_group="lhcb_prod", owner="p")])
        set_limit(s, "lhcb", LimitSpec(SITE, "owner_group", "lhcb_prod", max_running=0),
                  now=now)
    with db.factory.begin() as s:
        held = pilot_claim(s, now, site=SITE)
    assert held.claims == [] and held.reason == NO_MATCH_LIMITS


def test_owner_group_limit(db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        prod = submit(s, settings, now, [requirements(owner_group="lhcb_prod", owner="p")] * 3)
        user = submit(s, settings, now, [requirements()] * 2)
        set_limit(s, "lhcb", LimitSpec(SITE, "owner_group", "lhcb_prod", max_running=1),
                  now=now)
    with db.factory.begin() as s:
        outcome = pilot_claim(s, now, count=10, site=SITE)
    ids = claimed_ids(outcome)
    assert len(set(ids) & set(prod)) == 1 and set(user) <= set(ids) and len(ids) == 3


def test_ce_limit_applies_to_that_ce_only(db: Database, settings: Settings,
                                          now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(job_type="MC")] * 6)
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", ce="ce1.alpha.org",
                                       max_running=1), now=now)
    # jobs matched at another CE of the site neither are held nor count against ce1
    with db.factory.begin() as s:
        other_ce = pilot_claim(s, now, count=3, site=SITE, ce="ce2.alpha.org")
    assert len(other_ce.claims) == 3
    with db.factory.begin() as s:
        at_ce1 = pilot_claim(s, now, count=3, site=SITE, ce="ce1.alpha.org")
    assert len(at_ce1.claims) == 1
    with db.factory() as s:
        stored = s.get(Job, at_ce1.claims[0].job_id)
        assert stored is not None and (stored.site, stored.ce) == (SITE, "ce1.alpha.org")
    with db.factory.begin() as s:
        held = pilot_claim(s, now, site=SITE, ce="ce1.alpha.org")
    assert held.claims == [] and held.reason == NO_MATCH_LIMITS
    with db.factory.begin() as s:
        assert len(pilot_claim(s, now, site=SITE, ce="ce2.alpha.org").claims) == 1


def test_site_wide_limit_counts_every_ce(db: Database, settings: Settings,
                                         now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(job_type="MC")] * 4)
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", max_running=2), now=now)
    with db.factory.begin() as s:
        assert len(pilot_claim(s, now, site=SITE, ce="ce1").claims) == 1
    with db.factory.begin() as s:
        assert len(pilot_claim(s, now, count=3, site=SITE, ce="ce2").claims) == 1
    with db.factory.begin() as s:
        assert pilot_claim(s, now, site=SITE, ce="ce3").reason == NO_MATCH_LIMITS


def test_finished_or_killed_job_frees_a_slot(db: Database, settings: Settings,
                                             now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(job_type="MC")] * 4)
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", max_running=1), now=now)
    with db.factory.begin() as s:
        (first,) = claimed_ids(pilot_claim(s, now, site=SITE))
    with db.factory.begin() as s:
        apply_transition(s, [first], JobStatus.MATCHED, JobStatus.RUNNING,
                         minor_status="running", source="test", now=now)
    with db.factory.begin() as s:  # Running still counts
        assert pilot_claim(s, now, site=SITE).reason == NO_MATCH_LIMITS
    with db.factory.begin() as s:
        apply_transition(s, [first], JobStatus.RUNNING, JobStatus.DONE,
                         minor_status="done", source="test", now=now)
    with db.factory.begin() as s:
        (second,) = claimed_ids(pilot_claim(s, now, site=SITE))
    with db.factory.begin() as s:
        assert pilot_claim(s, now, site=SITE).reason == NO_MATCH_LIMITS
        kill_job(s, second, by="operator", now=now)
    with db.factory.begin() as s:
        assert len(pilot_claim(s, now, site=SITE).claims) == 1


def test_another_vos_limit_does_not_apply(db: Database, settings: Settings,
                                          now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(job_type="MC")] * 2)
        set_limit(s, "belle", LimitSpec(SITE, "job_type", "MC", max_running=0), now=now)
    with db.factory.begin() as s:
        assert len(pilot_claim(s, now, count=2, site=SITE).claims) == 2


def test_no_job_the_pilot_can_run_is_not_blamed_on_limits(db: Database, settings: Settings,
                                                          now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(job_type="MC")])
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", max_running=0), now=now)
    with db.factory.begin() as s:
        outcome = pilot_claim(s, now, site=SITE, job_type="User")
    assert outcome.claims == [] and outcome.reason == NO_MATCH_NO_JOB
    with db.factory.begin() as s:
        assert pilot_claim(s, now, site=SITE).reason == NO_MATCH_LIMITS


def test_limits_of_the_site_left_after_a_ban_apply(db: Database, settings: Settings,
                                                   now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(job_type="MC")] * 3)
        ban_site(s, "lhcb", OTHER_SITE, reason="downtime", by="operator", now=now)
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", max_running=1), now=now)
    with db.factory.begin() as s:
        outcome = pilot_claim(s, now, count=5, site=[SITE, OTHER_SITE])
    assert len(outcome.claims) == 1
    with db.factory.begin() as s:
        assert pilot_claim(s, now, site=[SITE, OTHER_SITE]).reason == NO_MATCH_LIMITS


def test_claim_jobs_passes_over_excluded_values(db: Database, settings: Settings,
                                                now: datetime) -> None:
    with db.factory.begin() as s:
        mc = submit(s, settings, now, [requirements(job_type="MC")] * 2)
        prod = submit(s, settings, now, [requirements(owner_group="lhcb_prod", owner="p")] * 2)
        user = submit(s, settings, now, [requirements(owner="bob")] * 2)
    resource = parse_resource({"vo": "lhcb", "pilot_reference": "p", "owner_group": "ANY"})
    no_mc = Exclusions(job_types=frozenset({"MC"}))
    neither = Exclusions(job_types=frozenset({"MC"}), owner_groups=frozenset({"lhcb_prod"}))
    with db.factory.begin() as s:
        assert sum(q.waiting for q in matching_queues(s, resource, exclusions=neither)) == 2
        assert sum(q.waiting for q in matching_queues(s, resource, exclusions=no_mc)) == 4
        got = claim_jobs(s, resource, now=now, count=10, exclusions=neither)
    assert sorted(c.job_id for c in got) == sorted(user)
    with db.factory.begin() as s:
        got = claim_jobs(s, resource, now=now, count=10, exclusions=no_mc)
    assert sorted(c.job_id for c in got) == sorted(prod)
    with db.factory.begin() as s:
        got = claim_jobs(s, resource, now=now, count=10, exclusions=NO_EXCLUSIONS)
    assert sorted(c.job_id for c in got) == sorted(mc)
    assert not NO_EXCLUSIONS and no_mc


# -- matching delays ------------------------------------------------------------------------

def test_matching_delay(db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(job_type="MC")] * 4)
        (user,) = submit(s, settings, now, [requirements(owner="bob")])
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", matching_delay=60), now=now)
    with db.factory.begin() as s:
        first = pilot_claim(s, now, count=3, site=SITE, job_type="MC")
    assert len(first.claims) == 1  # the delay also spaces jobs of one claim
    with db.factory() as s:
        (limit,) = site_limits(s, "lhcb")
        assert limit.last_matched_at == now
    within = now + timedelta(seconds=59)
    with db.factory.begin() as s:
        held = pilot_claim(s, within, site=SITE, job_type="MC")
    assert held.claims == [] and held.reason == NO_MATCH_LIMITS
    with db.factory.begin() as s:  # other job types are not delayed
        assert claimed_ids(pilot_claim(s, within, site=SITE)) == [user]
    with db.factory.begin() as s:  # nor are other sites
        assert len(pilot_claim(s, within, site=OTHER_SITE, job_type="MC").claims) == 1
    after = now + timedelta(seconds=60)
    with db.factory.begin() as s:
        assert len(pilot_claim(s, after, site=SITE, job_type="MC").claims) == 1
    with db.factory.begin() as s:
        assert pilot_claim(s, after + timedelta(seconds=1), site=SITE).reason == NO_MATCH_LIMITS


# -- managing limits ------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"attribute": "site"},
    {"attribute": "owner"},
    {"attribute": ""},
    {"max_running": -1},
    {"matching_delay": -5},
    {"max_running": 3, "matching_delay": -1},
    {"max_running": None, "matching_delay": None},
    {"site": " "},
    {"value": ""},
], ids=["attribute site", "attribute owner", "attribute empty", "negative max_running",
        "negative matching_delay", "negative delay beside a maximum", "neither number",
        "empty site", "empty value"])
def test_limit_spec_refusals(kwargs: dict[str, Any]) -> None:
    spec: dict[str, Any] = {"site": SITE, "attribute": "job_type", "value": "MC",
                            "max_running": 1}
    spec.update(kwargs)
    with pytest.raises(InvalidInputError):
        LimitSpec(**spec)


def test_limit_spec_accepts_zero_and_either_number() -> None:
    assert LimitSpec(SITE, "job_type", "MC", max_running=0).max_running == 0
    assert LimitSpec(SITE, "owner_group", "g", matching_delay=0).matching_delay == 0
    both = LimitSpec(SITE, "job_type", "MC", ce="ce1", max_running=2, matching_delay=30)
    assert (both.ce, both.max_running, both.matching_delay) == ("ce1", 2, 30)


def test_set_limit_replaces_the_numbers_of_the_same_limit(db: Database, now: datetime) -> None:
    later = now + timedelta(minutes=5)
    with db.factory.begin() as s:
        first = set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", max_running=2), now=now)
        first_id = first.id
    with db.factory.begin() as s:
        again = set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", matching_delay=30),
                          now=later)
        assert again.id == first_id
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", ce="ce1", max_running=1),
                  now=later)
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "User", max_running=1), now=later)
        set_limit(s, "belle", LimitSpec(SITE, "job_type", "MC", max_running=9), now=later)
    with db.factory() as s:
        rows = [(x.id == first_id, x.site, x.ce, x.attribute, x.value, x.max_running,
                 x.matching_delay, x.updated_at) for x in site_limits(s, "lhcb")]
        total = s.scalar(select(func.count()).select_from(SiteLimit))
    assert rows == [
        (True, SITE, "", "job_type", "MC", None, 30, later),
        (False, SITE, "", "job_type", "User", 1, None, later),
        (False, SITE, "ce1", "job_type", "MC", 1, None, later),
    ]
    assert total == 4


def test_delete_limit(db: Database, settings: Settings, now: datetime) -> None:
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(job_type="MC")])
        mine = set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", max_running=0),
                         now=now).id
        theirs = set_limit(s, "belle", LimitSpec(SITE, "job_type", "MC", max_running=0),
                           now=now).id
    with db.factory.begin() as s, pytest.raises(NotFoundError):
        delete_limit(s, "lhcb", theirs)
    with db.factory.begin() as s, pytest.raises(NotFoundError):
        delete_limit(s, "lhcb", max(mine, theirs) + 1000)
    with db.factory() as s:
        assert [x.id for x in site_limits(s, "belle")] == [theirs]
    with db.factory.begin() as s:
        assert pilot_claim(s, now, site=SITE).reason == NO_MATCH_LIMITS
    with db.factory.begin() as s:
        delete_limit(s, "lhcb", mine)
    with db.factory() as s:
        assert site_limits(s, "lhcb") == []
    with db.factory.begin() as s:
        assert len(pilot_claim(s, now, site=SITE).claims) == 1


# -- concurrency ------------------------------------------------------------------------------

LIMIT = 5


def _limited_claimer(url: str, pilot: str, start: Any, finish_jobs: bool,
                     rounds: int) -> tuple[list[int], int]:
    """Claim for SITE again and again; return the jobs got and the largest number of limited
    jobs seen running at the site inside a claiming transaction (after its claim)."""
    factory = make_session_factory(make_engine(url, pool_size=1))
    rng = random.Random(pilot)
    got: list[int] = []
    seen = 0
    held = 0
    with factory() as s:  # connect before the race starts
        s.execute(select(1))
    start.wait(timeout=120)  # every process ready: the race starts at once

    def work(s: Session, n: int) -> tuple[list[int], int, str | None]:
        outcome = claim_for_pilot(s, parse_resource({
            "vo": "lhcb", "pilot_reference": pilot, "site": SITE, "ce": f"ce{rng.randint(1, 2)}"
        }), now=datetime.now(UTC), count=n, rng=rng)
        running = s.scalar(select(func.count()).select_from(Job).where(
            Job.site == SITE, Job.job_type == "MC",
            Job.status.in_(("Matched", "Running", "Stalled", "Completing")))) or 0
        return claimed_ids(outcome), running, outcome.reason

    for _ in range(rounds):
        ids, running, reason = run_in_transaction(factory, lambda s: work(
            s, rng.choice((1, 1, 2, 3))))
        got += ids
        seen = max(seen, running)
        if finish_jobs and ids:
            time.sleep(rng.random() * 0.02)
            run_in_transaction(factory, lambda s, ids=ids: apply_transition(
                s, ids, JobStatus.MATCHED, JobStatus.DONE, minor_status="done",
                source="test", now=datetime.now(UTC)))
        if reason == NO_MATCH_LIMITS:
            held += 1
            if not finish_jobs and held >= 3:
                break
        elif reason == NO_MATCH_NO_JOB:
            break
    return got, seen


def _race(db: Database, n_procs: int, finish_jobs: bool, rounds: int
          ) -> list[tuple[list[int], int]]:
    """Run ``n_procs`` claimers at once (spawned processes, released together)."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(n_procs) as pool:
        start = manager.Barrier(n_procs)
        return pool.starmap(_limited_claimer, [
            (db.url, f"pilot-{i}", start, finish_jobs, rounds) for i in range(n_procs)],
            chunksize=1)


@pytest.mark.slow
def test_concurrent_claims_never_exceed_the_running_limit(db: Database, settings: Settings,
                                                          now: datetime) -> None:
    n_procs = 6 if db.is_server else 4
    with db.factory.begin() as s:
        mc = submit(s, settings, now, [requirements(job_type="MC", owner=f"u{i % 4}")
                                       for i in range(200)])
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", max_running=LIMIT), now=now)
    results = _race(db, n_procs, finish_jobs=False, rounds=40)
    claimed = [job for got, _ in results for job in got]
    assert len(claimed) == len(set(claimed)) == LIMIT
    assert max(seen for _, seen in results) == LIMIT
    with db.factory() as s:
        matched = s.scalar(select(func.count()).select_from(Job)
                           .where(Job.status == "Matched", Job.site == SITE))
        waiting = s.scalar(select(func.count()).select_from(TaskQueueJob))
    assert matched == LIMIT
    assert waiting == len(mc) - LIMIT


@pytest.mark.slow
def test_concurrent_claims_and_finishes_stay_within_the_limit(db: Database, settings: Settings,
                                                              now: datetime) -> None:
    n_procs = 6 if db.is_server else 4
    with db.factory.begin() as s:
        submit(s, settings, now, [requirements(job_type="MC", owner=f"u{i % 4}")
                                  for i in range(400)])
        set_limit(s, "lhcb", LimitSpec(SITE, "job_type", "MC", max_running=LIMIT), now=now)
    results = _race(db, n_procs, finish_jobs=True, rounds=25)
    claimed = [job for got, _ in results for job in got]
    assert len(claimed) == len(set(claimed))
    assert len(claimed) > 2 * LIMIT, "finished jobs should have freed their slots"
    # Inside every claiming transaction, after its claim, the limited jobs at the site
    # (those others committed plus its own) never exceeded the maximum.
    assert max(seen for _, seen in results) <= LIMIT
    with db.factory() as s:
        matched = s.scalar(select(func.count()).select_from(Job)
                           .where(Job.status == "Matched"))
    assert matched == 0
