"""A Waiting job that no configured queue can run: the watchdog says so in its minor status,
gives the usual one back when a queue that can run it appears, and fails it after
``[agents] unrunnable_timeout`` when the operator set one."""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from agents import watchdog
from agents.context import AgentContext
from agents.watchdog import watch_jobs
from taskqueue.core.settings import ResourcesSettings, Settings
from taskqueue.core.states import NO_DIRECTOR_MINOR_STATUS, NO_QUEUE_MINOR_STATUS
from taskqueue.db.models import Job, TaskQueue, TaskQueueJob
from taskqueue.queues import unrunnable
from taskqueue.queues.jobs import job_history
from taskqueue.queues.taskqueues import WAITING_MINOR_STATUS
from taskqueue.queues.unrunnable import UnrunnableOutcome, mark_unrunnable
from tests.conftest import Database
from tests.helpers import requirements, submit

#: One queue: an hour of CPU at 1 HS06 (3,600 s).
ONE_HOUR_QUEUE = """
[Sites."DIRAC.Demo.local"]
VO = "lhcb"
HS06 = 1.0
[Sites."DIRAC.Demo.local".CEs.localhost]
Executor = "local"
[Sites."DIRAC.Demo.local".CEs.localhost.Queues.local]
MaxCPUTime = 60
"""
#: The same site with a second queue of two days.
WITH_A_LONG_QUEUE = ONE_HOUR_QUEUE + """
[Sites."DIRAC.Demo.local".CEs.localhost.Queues.long]
MaxCPUTime = 2880
"""


def _settings(settings: Settings, tmp_path: Path, timeout: int = 0) -> Settings:
    file = tmp_path / "resources.toml"
    file.write_text(ONE_HOUR_QUEUE, encoding="utf-8")
    return replace(settings, resources=ResourcesSettings(file=str(file)),
                   agents=replace(settings.agents, unrunnable_timeout=timeout))


def _watch(db: Database, settings: Settings, at: datetime) -> str:
    return watch_jobs(AgentContext(settings=settings, factory=db.factory, clock=lambda: at))


def _job(db: Database, job_id: int) -> tuple[str, str, bool]:
    with db.factory() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.status, job.minor_status, s.get(TaskQueueJob, job_id) is not None


def _two_jobs(db: Database, settings: Settings, now: datetime) -> tuple[int, int]:
    """A job of a day's CPU (the default) and one of ten minutes."""
    with db.factory.begin() as s:
        long_job, short_job = submit(s, settings, now, [requirements(cpu_time=86_400),
                                                        requirements(cpu_time=600)])
    return long_job, short_job


def test_a_job_no_queue_can_run_says_so(db: Database, settings: Settings, tmp_path: Path,
                                        now: datetime) -> None:
    settings = _settings(settings, tmp_path)
    long_job, short_job = _two_jobs(db, settings, now)
    line = _watch(db, settings, now)
    assert line.endswith(", 1 waiting jobs no queue can run, 0 no queue with an Executor can "
                         "run, 0 runnable again, 0 failed for it")
    assert _job(db, long_job) == ("Waiting", NO_QUEUE_MINOR_STATUS, True)
    assert _job(db, short_job) == ("Waiting", WAITING_MINOR_STATUS, True)
    with db.factory() as s:
        assert [h.minor_status for h in job_history(s, long_job)][-1] == NO_QUEUE_MINOR_STATUS
    # Said once: the next turn changes nothing, and the job keeps waiting (no timeout set).
    assert ", 0 waiting jobs no queue can run" in _watch(db, settings, now + timedelta(days=30))
    assert _job(db, long_job) == ("Waiting", NO_QUEUE_MINOR_STATUS, True)


def test_a_queue_that_can_run_it_gives_the_usual_status_back(
        db: Database, settings: Settings, tmp_path: Path, now: datetime) -> None:
    settings = _settings(settings, tmp_path)
    long_job, _ = _two_jobs(db, settings, now)
    _watch(db, settings, now)
    file = Path(settings.resources.file)
    file.write_text(WITH_A_LONG_QUEUE, encoding="utf-8")
    os.utime(file, ns=(0, 1))  # read again whatever the file system's clock resolution
    assert _watch(db, settings, now).endswith(", 0 waiting jobs no queue can run, 0 no queue "
                                              "with an Executor can run, 1 runnable again, "
                                              "0 failed for it")
    assert _job(db, long_job) == ("Waiting", WAITING_MINOR_STATUS, True)


#: The long queue on a CE without an Executor: pilots started by hand may come, the site
#: director starts none.
WITH_A_LONG_QUEUE_BY_HAND = ONE_HOUR_QUEUE + """
[Sites."DIRAC.Demo.local".CEs.byhand.Queues.long]
MaxCPUTime = 2880
"""


def test_a_job_only_a_queue_without_an_executor_can_run_says_so(
        db: Database, settings: Settings, tmp_path: Path, now: datetime) -> None:
    settings = _settings(settings, tmp_path, timeout=60)
    Path(settings.resources.file).write_text(WITH_A_LONG_QUEUE_BY_HAND, encoding="utf-8")
    long_job, short_job = _two_jobs(db, settings, now)
    line = _watch(db, settings, now)
    assert ", 0 waiting jobs no queue can run, 1 no queue with an Executor can run, " in line
    assert _job(db, long_job) == (
        "Waiting", "No queue with a way to start pilots (an Executor) can run it (see explain)",
        True)
    assert _job(db, short_job) == ("Waiting", WAITING_MINOR_STATUS, True)
    # Pilots started by hand may still come: it is not failed as unrunnable.
    _watch(db, settings, now + timedelta(days=1))
    assert _job(db, long_job)[0] == "Waiting"
    file = Path(settings.resources.file)
    file.write_text(WITH_A_LONG_QUEUE, encoding="utf-8")
    os.utime(file, ns=(0, 1))
    assert ", 1 runnable again, " in _watch(db, settings, now + timedelta(days=1))
    assert _job(db, long_job) == ("Waiting", WAITING_MINOR_STATUS, True)


def test_the_operator_may_fail_it_after_a_time(db: Database, settings: Settings,
                                               tmp_path: Path, now: datetime) -> None:
    settings = _settings(settings, tmp_path, timeout=3600)
    long_job, short_job = _two_jobs(db, settings, now)
    _watch(db, settings, now)
    _watch(db, settings, now + timedelta(seconds=3599))
    assert _job(db, long_job) == ("Waiting", NO_QUEUE_MINOR_STATUS, True)
    line = _watch(db, settings, now + timedelta(seconds=3600))
    assert line.endswith(", 0 waiting jobs no queue can run, 0 no queue with an Executor can "
                         "run, 0 runnable again, 1 failed for it")
    assert _job(db, long_job) == ("Failed", "No configured queue could run it within 3600 s",
                                  False)
    assert _job(db, short_job) == ("Waiting", WAITING_MINOR_STATUS, True)


def test_a_turn_takes_them_in_batches_and_reads_no_job_per_job(
        db: Database, settings: Settings, now: datetime) -> None:
    """Each call flags, clears or fails at most ``limit`` jobs and says whether more wait; a
    later call takes the next ones (the watchdog calls again within its turn)."""
    with db.factory.begin() as s:
        jobs = submit(s, settings, now, [requirements(cpu_time=600) for _ in range(5)])

    def turn(runnable: set[int], at: datetime, fail_after: int = 0) -> UnrunnableOutcome:
        with db.factory.begin() as s:
            return mark_unrunnable(s, runnable, now=at, fail_after=fail_after, limit=2)

    assert turn(set(), now) == UnrunnableOutcome(2, 0, 0, True)
    assert turn(set(), now) == UnrunnableOutcome(2, 0, 0, True)
    assert turn(set(), now) == UnrunnableOutcome(1, 0, 0, False)
    assert turn(set(), now) == UnrunnableOutcome(0, 0, 0, False)
    assert {_job(db, j)[1] for j in jobs} == {NO_QUEUE_MINOR_STATUS}
    with db.factory() as s:
        queues = set(s.scalars(select(TaskQueue.id)))
    assert turn(queues, now) == UnrunnableOutcome(0, 2, 0, True)
    assert turn(queues, now) == UnrunnableOutcome(0, 2, 0, True)
    assert turn(queues, now) == UnrunnableOutcome(0, 1, 0, False)
    assert {_job(db, j)[1] for j in jobs} == {WAITING_MINOR_STATUS}
    later = now + timedelta(hours=2)
    assert turn(set(), now).flagged == 2  # two flagged at ``now``, three 90 min later
    while turn(set(), now + timedelta(minutes=90)).more:
        pass
    assert turn(set(), later, fail_after=3600) == UnrunnableOutcome(0, 0, 2, True)
    assert turn(set(), later, fail_after=3600) == UnrunnableOutcome(0, 0, 0, False)
    assert turn(set(), later + timedelta(hours=1), fail_after=3600) == UnrunnableOutcome(
        0, 0, 2, True)
    assert turn(set(), later + timedelta(hours=1), fail_after=3600) == UnrunnableOutcome(
        0, 0, 1, False)
    assert {_job(db, j)[0] for j in jobs} == {"Failed"}


def test_a_call_reads_one_window_of_queue_rows_and_the_next_resumes_after_it(
        db: Database, settings: Settings, now: datetime) -> None:
    """What one call reads does not grow with the waiting jobs: ``window`` queue rows from
    where the last call stopped, the jobs read by their primary key; the walk starts again
    from the first once it reached the last row. Jobs of queues no queue with an Executor can
    run are said so a window at a time too."""
    with db.factory.begin() as s:
        jobs = submit(s, settings, now, [requirements(cpu_time=600) for _ in range(5)])
    with db.factory() as s:
        queues = set(s.scalars(select(TaskQueue.id)))

    def call(after: int, window: int = 2) -> UnrunnableOutcome:
        with db.factory.begin() as s:
            return mark_unrunnable(s, queues, now=now, fail_after=0, directed=set(),
                                   after=after, window=window)

    first = call(0)
    assert (first.undirected, first.more, first.after) == (2, True, jobs[1])
    assert [_job(db, j)[1] for j in jobs].count(NO_DIRECTOR_MINOR_STATUS) == 2
    second = call(first.after)
    assert (second.undirected, second.more, second.after) == (2, True, jobs[3])
    last = call(second.after)
    assert (last.undirected, last.more, last.after) == (1, False, 0)
    assert {_job(db, j)[1] for j in jobs} == {NO_DIRECTOR_MINOR_STATUS}
    # Nothing left to change: a call still reads one window only, and says where it stopped.
    again = call(0)
    assert (again.undirected, again.more, again.after) == (0, True, jobs[1])
    # A full batch of one kind stops the window there: the next call resumes at the job left.
    with db.factory.begin() as s:
        cut = mark_unrunnable(s, queues, now=now, fail_after=0, limit=1, window=10)
    assert (cut.cleared, cut.more, cut.after) == (1, True, jobs[1] - 1)


def test_the_watchdog_resumes_its_walk_at_the_next_turn(
        db: Database, settings: Settings, tmp_path: Path, now: datetime,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn reads windows of waiting jobs for a few seconds only (here none beyond the
    first): the next turn of the same watchdog goes on from where it stopped."""
    settings = _settings(settings, tmp_path)
    with db.factory.begin() as s:
        jobs = submit(s, settings, now, [requirements(cpu_time=86_400) for _ in range(3)])
    monkeypatch.setattr(watchdog, "UNRUNNABLE_SECONDS", 0.0)
    monkeypatch.setattr(unrunnable, "WINDOW", 2)
    ctx = AgentContext(settings=settings, factory=db.factory, clock=lambda: now)
    assert ", 2 waiting jobs no queue can run" in watch_jobs(ctx)
    assert ctx.unrunnable_after == jobs[1]
    assert [_job(db, j)[1] for j in jobs] == [NO_QUEUE_MINOR_STATUS] * 2 + [
        WAITING_MINOR_STATUS]
    assert ", 1 waiting jobs no queue can run" in watch_jobs(ctx)
    assert ctx.unrunnable_after == 0
    assert {_job(db, j)[1] for j in jobs} == {NO_QUEUE_MINOR_STATUS}


def test_a_queue_made_after_the_runnable_ones_were_read_is_left_alone(
        db: Database, settings: Settings, now: datetime) -> None:
    """The watchdog reads the queues with the runnable ones; a queue not among them (made
    since) is not taken for one no configured queue can run."""
    with db.factory.begin() as s:
        first, second = submit(s, settings, now, [requirements(cpu_time=600),
                                                  requirements(cpu_time=86_400)])
    with db.factory() as s:
        queue_of = {row.job_id: row.tq_id for row in s.scalars(select(TaskQueueJob))}
    assert queue_of[first] != queue_of[second]
    with db.factory.begin() as s:
        outcome = mark_unrunnable(s, set(), now=now, fail_after=0,
                                  known={queue_of[first]})
    assert outcome == UnrunnableOutcome(1, 0, 0, False)
    assert _job(db, first)[1] == NO_QUEUE_MINOR_STATUS
    assert _job(db, second)[1] == WAITING_MINOR_STATUS


def test_a_gpu_job_no_queue_offers_gpus_to_says_so_until_one_does(
        db: Database, settings: Settings, tmp_path: Path, now: datetime) -> None:
    settings = _settings(settings, tmp_path)
    with db.factory.begin() as s:
        gpu_job, plain_job = submit(s, settings, now, [requirements(cpu_time=600, gpus=1),
                                                       requirements(cpu_time=600)])
    assert ", 1 waiting jobs no queue can run" in _watch(db, settings, now)
    assert _job(db, gpu_job) == ("Waiting", NO_QUEUE_MINOR_STATUS, True)
    assert _job(db, plain_job) == ("Waiting", WAITING_MINOR_STATUS, True)
    file = Path(settings.resources.file)
    file.write_text(ONE_HOUR_QUEUE + "NumberOfGPUs = 2\n", encoding="utf-8")
    assert ", 1 runnable again" in _watch(db, settings, now + timedelta(minutes=5))
    assert _job(db, gpu_job) == ("Waiting", WAITING_MINOR_STATUS, True)
