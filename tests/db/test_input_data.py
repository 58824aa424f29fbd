"""Jobs that go where their data is, on every database: the replica catalogue, the chain's data
step (DIRAC's InputData optimizer: the sites reaching a replica of every file), and explain's
data rule."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import pytest
from sqlalchemy import select

from optimizers.chain import (
    ChainContext,
    Identity,
    optimize_received,
    submissions_from_text,
    submit,
)
from optimizers.jobexplain import explain_job
from optimizers.resources import ResourcesConfig, parse_resources
from taskqueue.core.errors import InvalidInputError
from taskqueue.core.settings import Settings
from taskqueue.db.database import Session
from taskqueue.db.models import Job, TaskQueueJob, TaskQueueSite
from taskqueue.files.replicas import (
    MAX_LFN,
    add_replicas,
    list_replicas,
    normal_lfn,
    remove_replicas,
    replica_sites,
)
from taskqueue.queues.jobcontrol import reschedule_job
from tests.conftest import Database

GRID = """
[JobDescription]
SE = "list"
CloseSE = "list"

[Sites."S.A.org"]
VO = ["lhcb", "belle"]
HS06 = 10.0
SE = ["A-DST", "A-RAW"]
[Sites."S.A.org".CEs."ce.a.org".Queues.long]
MaxCPUTime = 2880

[Sites."S.B.org"]
VO = ["lhcb", "belle"]
HS06 = 10.0
SE = "B-DST"
CloseSE = ["A-DST"]
[Sites."S.B.org".VOs.belle]
SE = "B-BELLE"
[Sites."S.B.org".CEs."ce.b.org".Queues.grid]
MaxCPUTime = 2880

[Sites."S.C.org"]
VO = ["lhcb"]
HS06 = 10.0
SE = "C-DST"
[Sites."S.C.org".CEs."ce.c.org".Queues.grid]
MaxCPUTime = 2880
"""

ME = Identity("lhcb", "alice", "lhcb_user")


@pytest.fixture()
def grid() -> ResourcesConfig:
    return parse_resources(GRID, "test-grid.toml")


@pytest.fixture()
def ctx(grid: ResourcesConfig, now: datetime) -> ChainContext:
    return ChainContext(Settings(), grid, now, random.Random(5))


def _replicas(db: Database, now: datetime, pairs: list[tuple[str, str]], vo: str = "lhcb"
              ) -> int:
    with db.factory.begin() as s:
        return add_replicas(s, vo, pairs, now=now)


def _submit(db: Database, ctx: ChainContext, text: str, who: Identity = ME) -> list[Job]:
    with db.factory.begin() as s:
        result = submit(s, submissions_from_text(text, "jdl"), who, ctx)
    with db.factory() as s:
        return [s.get(Job, i) for i in result.stored]  # type: ignore[misc]


def _sites(db: Database, job: Job) -> set[str]:
    with db.factory() as s:
        tq_id = s.scalar(select(TaskQueueJob.tq_id).where(TaskQueueJob.job_id == job.id))
        assert tq_id is not None
        return set(s.scalars(select(TaskQueueSite.value).where(TaskQueueSite.tq_id == tq_id)))


# -- the catalogue -----------------------------------------------------------------------------


def test_replicas_are_added_once_and_listed(db: Database, now: datetime) -> None:
    assert _replicas(db, now, [("LFN:/lhcb/d/f1", "A-DST"), ("/lhcb/d/f1", "A-DST"),
                               ("/lhcb/d/f1", "B-DST"), ("/lhcb/d/f2", "A-DST")]) == 3
    assert _replicas(db, now, [("/lhcb/d/f1", "A-DST"), ("/lhcb/d/f3", "C-DST")]) == 1
    with db.factory() as s:
        assert [(r.lfn, r.se) for r in list_replicas(s, "lhcb")] == [
            ("/lhcb/d/f1", "A-DST"), ("/lhcb/d/f1", "B-DST"), ("/lhcb/d/f2", "A-DST"),
            ("/lhcb/d/f3", "C-DST")]
        assert [r.lfn for r in list_replicas(s, "lhcb", se="A-DST")] == ["/lhcb/d/f1",
                                                                          "/lhcb/d/f2"]
        assert replica_sites(s, "lhcb", ["/lhcb/d/f1", "/lhcb/d/none"]) == {
            "/lhcb/d/f1": frozenset({"A-DST", "B-DST"})}
        assert list_replicas(s, "belle") == []  # another VO's catalogue is its own


def test_prefix_listing_treats_like_wildcards_as_text(db: Database, now: datetime) -> None:
    _replicas(db, now, [("/lhcb/a_b/f", "A-DST"), ("/lhcb/axb/f", "A-DST"),
                        ("/lhcb/a%/f", "A-DST")])
    with db.factory() as s:
        assert [r.lfn for r in list_replicas(s, "lhcb", prefix="/lhcb/a_")] == ["/lhcb/a_b/f"]
        assert [r.lfn for r in list_replicas(s, "lhcb", prefix="/lhcb/a%")] == ["/lhcb/a%/f"]


def test_remove_replicas(db: Database, now: datetime) -> None:
    _replicas(db, now, [("/lhcb/f1", "A-DST"), ("/lhcb/f1", "B-DST"), ("/lhcb/f2", "A-DST")])
    _replicas(db, now, [("/lhcb/f1", "A-DST")], vo="belle")
    with db.factory.begin() as s:
        assert remove_replicas(s, "lhcb", ["/lhcb/f1"], se="B-DST") == 1
        assert remove_replicas(s, "lhcb", ["LFN:/lhcb/f1", "/lhcb/f2", "/lhcb/never"]) == 2
    with db.factory() as s:
        assert list_replicas(s, "lhcb") == []
        assert len(list_replicas(s, "belle")) == 1


def test_long_and_unusual_lfns_are_stored_exactly(db: Database, now: datetime) -> None:
    long = "/lhcb/" + "x" * (MAX_LFN - 6)
    odd = "/lhcb/ünïcödé/$HOME/{a,b}/f'\";--.dst"
    _replicas(db, now, [(long, "A-DST"), (odd, "A-DST")])
    with db.factory() as s:
        assert {r.lfn for r in list_replicas(s, "lhcb")} == {long, odd}
        assert set(replica_sites(s, "lhcb", [long, odd])) == {long, odd}


@pytest.mark.parametrize(("lfn", "says"), [
    ("data/run1.dst", "absolute path"), ("LFN:", "absolute path"), ("/a b", "spaces"),
    ("/a//b", "empty path component"), ("/a\nb", "control characters"),
    ("/" + "x" * MAX_LFN, "at most 1024"),
])
def test_bad_lfns_are_refused_and_nothing_is_stored(db: Database, now: datetime, lfn: str,
                                                     says: str) -> None:
    with pytest.raises(InvalidInputError, match=says):
        _replicas(db, now, [("/lhcb/good", "A-DST"), (lfn, "A-DST")])
    with db.factory() as s:
        assert list_replicas(s, "lhcb") == []


def test_bad_storage_element_names_are_refused(db: Database, now: datetime) -> None:
    for se in ("", "A DST", "x" * 65, "A;DROP"):
        with pytest.raises(InvalidInputError, match="storage element"):
            _replicas(db, now, [("/lhcb/f", se)])


def test_normal_lfn() -> None:
    assert normal_lfn("LFN:/lhcb/x") == normal_lfn("lfn:/lhcb/x") == "/lhcb/x"


# -- the data step -----------------------------------------------------------------------------


def test_a_job_goes_only_where_every_file_is_reached(db: Database, ctx: ChainContext,
                                                      now: datetime) -> None:
    # f1 at A-DST (read from S.A and, as its close SE, from S.B); f2 at A-RAW (S.A only).
    _replicas(db, now, [("/lhcb/f1", "A-DST"), ("/lhcb/f2", "A-RAW"), ("/lhcb/f3", "C-DST")])
    (one,) = _submit(db, ctx, '[Executable = "a"; InputData = {"LFN:/lhcb/f1"};]')
    (two,) = _submit(db, ctx, '[Executable = "a"; InputData = {"/lhcb/f1", "/lhcb/f2"};]')
    assert one.status == two.status == "Waiting"
    assert _sites(db, one) == {"S.A.org", "S.B.org"}
    assert _sites(db, two) == {"S.A.org"}


def test_the_data_rule_meets_the_users_sites(db: Database, ctx: ChainContext,
                                             now: datetime) -> None:
    _replicas(db, now, [("/lhcb/f1", "A-DST")])
    (kept,) = _submit(db, ctx, '[Executable = "a"; InputData = "/lhcb/f1"; '
                               'Site = {"S.B.org", "S.C.org"};]')
    assert _sites(db, kept) == {"S.B.org"}
    (banned,) = _submit(db, ctx, '[Executable = "a"; InputData = "/lhcb/f1"; '
                                 'BannedSite = "S.A.org";]')
    assert _sites(db, banned) == {"S.B.org"}
    (none,) = _submit(db, ctx, '[Executable = "a"; InputData = "/lhcb/f1"; Site = "S.C.org";]')
    assert none.status == "Failed"
    assert none.minor_status == ("InputData: the sites that reach its input files (S.A.org, "
                                 "S.B.org) are not among the sites it may run at")


def test_missing_files_fail_the_job_naming_them(db: Database, ctx: ChainContext,
                                                now: datetime) -> None:
    _replicas(db, now, [("/lhcb/f1", "A-DST")])
    (job,) = _submit(db, ctx, '[Executable = "a"; InputData = {"/lhcb/f1", "/lhcb/gone1", '
                              '"/lhcb/gone2", "/lhcb/gone3", "/lhcb/gone4"};]')
    assert job.status == "Failed"
    assert job.minor_status == (
        "InputData: no replica of /lhcb/gone1, /lhcb/gone2, /lhcb/gone3 and 1 more file in "
        "gridpilot's replica catalogue")


def test_files_no_site_reaches_together(db: Database, ctx: ChainContext, now: datetime) -> None:
    _replicas(db, now, [("/lhcb/f1", "A-RAW"), ("/lhcb/f2", "C-DST"), ("/lhcb/f3", "Z-TAPE")])
    (apart,) = _submit(db, ctx, '[Executable = "a"; InputData = {"/lhcb/f1", "/lhcb/f2"};]')
    assert apart.minor_status == (
        "InputData: no one site reaches a replica of every input file: /lhcb/f1 is reached "
        "from S.A.org; /lhcb/f2 is reached from S.C.org")
    (nowhere,) = _submit(db, ctx, '[Executable = "a"; InputData = {"/lhcb/f3"};]')
    assert nowhere.minor_status == (
        "InputData: no configured site reads from the storage elements holding /lhcb/f3 "
        "(/lhcb/f3 is at Z-TAPE)")


def test_vo_sections_give_a_vos_own_storage(db: Database, ctx: ChainContext,
                                            now: datetime) -> None:
    _replicas(db, now, [("/belle/f", "B-BELLE")], vo="belle")
    _replicas(db, now, [("/belle/f", "B-BELLE")], vo="lhcb")
    (belle,) = _submit(db, ctx, '[Executable = "a"; InputData = "/belle/f";]',
                       Identity("belle", "bob", "belle_user"))
    (lhcb,) = _submit(db, ctx, '[Executable = "a"; InputData = "/belle/f";]')
    assert _sites(db, belle) == {"S.B.org"}
    assert lhcb.status == "Failed"  # S.B.org's lhcb jobs do not read B-BELLE


def test_another_vos_replicas_do_not_count(db: Database, ctx: ChainContext,
                                           now: datetime) -> None:
    _replicas(db, now, [("/lhcb/f1", "A-DST")], vo="belle")
    (job,) = _submit(db, ctx, '[Executable = "a"; InputData = "/lhcb/f1";]')
    assert job.status == "Failed" and "no replica of /lhcb/f1" in job.minor_status


def test_lfn_input_sandbox_entries_are_input_data(db: Database, ctx: ChainContext,
                                                  now: datetime) -> None:
    _replicas(db, now, [("/lhcb/opts.py", "C-DST")])
    (job,) = _submit(db, ctx, '[Executable = "a"; InputSandbox = {"LFN:/lhcb/opts.py"};]')
    assert _sites(db, job) == {"S.C.org"}


def test_a_parametric_bulk_of_datasets(db: Database, ctx: ChainContext, now: datetime) -> None:
    # Each job its own files (DIRAC's Parameters.InputData), each job its own sites; one
    # catalogue lookup for all of them.
    _replicas(db, now, [("/lhcb/r1", "A-RAW"), ("/lhcb/r2", "C-DST")])
    calls: list[Sequence[str]] = []

    @dataclass(frozen=True)
    class Counting:
        name: str = "counting catalogue"

        def locate(self, session: Session, vo: str, lfns: Sequence[str]
                   ) -> Mapping[str, frozenset[str]]:
            calls.append(lfns)
            return replica_sites(session, vo, lfns)

    counted = ChainContext(ctx.settings, ctx.resources, now, random.Random(1), Counting())
    jobs = _submit(db, counted, 'Executable = "a"; InputData = %(F)s; Parameters = 2; '
                                "Parameters.F = {{/lhcb/r1}, {/lhcb/r2}};")
    assert [_sites(db, j) for j in jobs] == [{"S.A.org"}, {"S.C.org"}]
    assert calls == [["/lhcb/r1", "/lhcb/r2"]]


def test_a_rescheduled_job_is_placed_again_from_the_catalogue(db: Database, ctx: ChainContext,
                                                              now: datetime) -> None:
    _replicas(db, now, [("/lhcb/f1", "A-RAW")])
    (job,) = _submit(db, ctx, '[Executable = "a"; InputData = "/lhcb/f1";]')
    assert _sites(db, job) == {"S.A.org"}
    with db.factory.begin() as s:
        remove_replicas(s, "lhcb", ["/lhcb/f1"])
        add_replicas(s, "lhcb", [("/lhcb/f1", "C-DST")], now=now)
        reschedule_job(s, job.id, by="olga", now=now, reason="moved data", max_reschedules=3,
                       fail_when_exhausted=False)
    with db.factory.begin() as s:
        result = optimize_received(s, ctx, job_ids=[job.id])
    assert result.waiting == [job.id]
    assert _sites(db, job) == {"S.C.org"}


# -- explain -----------------------------------------------------------------------------------


def test_explain_shows_the_data_rule(db: Database, ctx: ChainContext, grid: ResourcesConfig,
                                     now: datetime) -> None:
    _replicas(db, now, [("/lhcb/f1", "A-DST"), ("/lhcb/f2", "A-RAW")])
    (job,) = _submit(db, ctx, '[Executable = "a"; InputData = {"/lhcb/f1", "/lhcb/f2"};]')
    with db.factory() as s:
        stored = s.get(Job, job.id)
        assert stored is not None
        at_a = explain_job(s, ctx.settings, grid, stored, queue="S.A.org/ce.a.org/long")
        at_b = explain_job(s, ctx.settings, grid, stored, queue="S.B.org/ce.b.org/grid")
    (rule_a,) = [r for r in at_a.rules if r.rule == "InputData"]
    (rule_b,) = [r for r in at_b.rules if r.rule == "InputData"]
    assert rule_a.holds and at_a.can_run
    assert rule_a.detail == ("InputData: every input file (2) has a replica that S.A.org reads "
                             "(A-DST, A-RAW)")
    assert not rule_b.holds and not at_b.can_run
    assert rule_b.detail == ("InputData: S.B.org reads from A-DST, B-DST, which holds no "
                             "replica of /lhcb/f2 (/lhcb/f2 is at A-RAW)")


def test_a_job_without_input_data_has_no_data_rule(db: Database, ctx: ChainContext,
                                                   grid: ResourcesConfig) -> None:
    (job,) = _submit(db, ctx, '[Executable = "a";]')
    with db.factory() as s:
        stored = s.get(Job, job.id)
        assert stored is not None
        rules = explain_job(s, ctx.settings, grid, stored, queue="S.A.org/ce.a.org/long").rules
    assert "InputData" not in {r.rule for r in rules}
