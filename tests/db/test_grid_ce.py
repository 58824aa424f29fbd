"""GridCE: the computing elements a job may run on are part of its task queue, and a resource
gets the job only from one of them (or when the job names none)."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import select

from optimizers.jdl import parse_jdl
from optimizers.jobjson import parse_json_text
from taskqueue.core.definitions import TaskQueueDefinition
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import Settings
from taskqueue.db.models import TaskQueueCE
from taskqueue.matching.explain import explain_match
from tests.conftest import Database
from tests.helpers import claim, requirements, submit


@pytest.mark.usefixtures("claim_entry")
def test_a_job_naming_ces_runs_only_on_them(db: Database, settings: Settings,
                                            now: datetime) -> None:
    with db.factory.begin() as s:
        (pinned,) = submit(s, settings, now, [requirements(ces={"ce1.a.org", "ce2.a.org"})])
        (free,) = submit(s, settings, now, [requirements(cpu_time=100)])
    with db.factory() as s:
        assert sorted(s.scalars(select(TaskQueueCE.value))) == ["ce1.a.org", "ce2.a.org"]
    with db.factory.begin() as s:  # another CE: only the free job
        assert [c.job_id for c in claim(s, now, count=5, ce="ce9.b.org")] == [free]
    with db.factory.begin() as s:
        assert [c.job_id for c in claim(s, now, count=5, ce="ce2.a.org")] == [pinned]


@pytest.mark.usefixtures("claim_entry")
def test_a_resource_without_a_ce_is_not_held_to_ces(db: Database, settings: Settings,
                                                    now: datetime) -> None:
    with db.factory.begin() as s:
        (pinned,) = submit(s, settings, now, [requirements(ces={"ce1.a.org"})])
    with db.factory.begin() as s:
        assert [c.job_id for c in claim(s, now)] == [pinned]


def test_ces_make_another_task_queue_and_explain_names_them(settings: Settings) -> None:
    plain = TaskQueueDefinition.for_job(requirements(), settings)
    pinned = TaskQueueDefinition.for_job(requirements(ces={"ce1.a.org"}), settings)
    assert plain.digest() != pinned.digest()
    rules = explain_match(pinned, parse_resource({"vo": "lhcb", "ce": "ce9.b.org"}))
    (ce,) = [r for r in rules if r.rule == "CE"]
    assert not ce.holds and "ce1.a.org" in ce.detail and "ce9.b.org" in ce.detail


def test_gridce_in_jdl_and_json() -> None:
    (one,) = parse_jdl('[Executable = "x"; GridCE = "ce1.a.org";]')
    (two,) = parse_jdl('[Executable = "x"; GridCEs = {"ce1.a.org", "ce2.a.org"};]')
    (three,) = parse_json_text('{"executable": "x", "attributes": {"custom_attributes": '
                               '{"GridCE": ["ce1.a.org"]}}}')
    assert one.ces == three.ces == frozenset({"ce1.a.org"})
    assert two.ces == frozenset({"ce1.a.org", "ce2.a.org"})
