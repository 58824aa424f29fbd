"""A job on a queue like the demo's (MaxCPUTime 60 minutes at 1 HS06, pilots started by the
site director): the matcher, given what such a pilot presents, and explain agree."""

from __future__ import annotations

import random
from datetime import datetime
from pathlib import Path

import pytest

from optimizers.chain import ChainContext, Identity, submissions_from_text, submit
from optimizers.classads import expression_check
from optimizers.jobexplain import explain_job
from optimizers.resources import load_resources
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.db.models import Job
from taskqueue.pilots.pilotmatch import match_for_pilot
from taskqueue.queues.submitpools import get_submit_pools_for_queue
from tests.conftest import Database
from tests.pilotlaunch import director_pilot

GRID = """
[Sites."DEMO.Like.org"]
VO = "lhcb"
HS06 = 1.0
Platform = "x86_64-el9"

[Sites."DEMO.Like.org".CEs.localhost]
Executor = "local"

[Sites."DEMO.Like.org".CEs.localhost.Queues.local]
MaxCPUTime = 60
NumberOfProcessors = 1
MaxRAM = 2048
"""
SITE, CE, QUEUE = "DEMO.Like.org", "localhost", "local"
ME = Identity("lhcb", "alice", "lhcb_user")


@pytest.fixture(autouse=True)
def _no_features(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MACHINEFEATURES", "JOBFEATURES", "JOBSTATUS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("cpu_time", "runs"), [("", False), ("CPUTime = 600;", True),
                                                ("CPUTime = 3600;", False)])
def test_matcher_and_explain_agree_on_a_demo_like_queue(
        db: Database, settings: Settings, now: datetime, tmp_path: Path, cpu_time: str,
        runs: bool) -> None:
    resources = tmp_path / "resources.toml"
    resources.write_text(GRID, encoding="utf-8")
    config = load_resources(resources)
    ctx = ChainContext(settings, config, now, random.Random(3))
    with db.factory.begin() as s:
        result = submit(s, submissions_from_text(
            f'[Executable = "a"; {cpu_time} Site = "{SITE}";]', "jdl"), ME, ctx)
    (job_id,) = result.stored
    with db.factory() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "Waiting"
        explained = explain_job(s, settings, config, job, queue=f"{SITE}/{CE}/{QUEUE}")
        pools = get_submit_pools_for_queue(s, SITE, CE, QUEUE)
    (cpu_rule,) = [r for r in explained.rules if r.rule == "CPU time"]
    assert "the pilots of this queue offer 3,540 s per core" in cpu_rule.detail
    started = director_pilot(settings, resources, SITE, CE, QUEUE, "lhcb", pools, tmp_path)
    assert started.request is not None
    pilot = parse_resource(started.request)
    answer = match_for_pilot(db.matches, pilot, now=now,
                             expression_check=expression_check(pilot))
    assert explained.can_run is runs
    assert [j.id for j in answer.jobs] == ([job_id] if runs else [])


def test_explain_says_when_a_resource_offers_no_cpu_bound(db: Database, settings: Settings,
                                                          now: datetime, tmp_path: Path) -> None:
    resources = tmp_path / "resources.toml"
    resources.write_text(GRID, encoding="utf-8")
    config = load_resources(resources)
    ctx = ChainContext(settings, config, now, random.Random(3))
    with db.factory.begin() as s:
        (job_id,) = submit(s, submissions_from_text('[Executable = "a";]', "jdl"), ME,
                           ctx).stored
    with db.factory() as s:
        job = s.get(Job, job_id)
        assert job is not None
        explained = explain_job(s, settings, config, job,
                                resource=parse_resource({"vo": "lhcb", "site": SITE}))
    (cpu_rule,) = [r for r in explained.rules if r.rule == "CPU time"]
    assert cpu_rule.holds and "the resource offers no CPU bound" in cpu_rule.detail
    assert explained.can_run
