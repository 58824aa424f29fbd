"""An operator retries a queue now (issue 34 item 2): ``gridpilot director retry
SITE/CE/QUEUE``, the real command in a subprocess, on every backend, ends the queue's
back-offs, whichever kind failed (its submissions, the polls of its CE), and the agent process
that had left the CE alone tries it at its next cycle."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from agents.context import AgentContext
from agents.director import Director
from taskqueue.core.settings import Settings
from taskqueue.pilots.records import record_ce_failure
from tests.conftest import Database
from tests.integration.test_cli import run
from tests.integration.test_director import (
    SECRET,
    FakeCEs,
    agent_settings,
    batch_ce,
    batch_resources,
    director_queue,
    echo_jobs,
    submit_jobs,
    targets,
)

KEY = ("Test.Batch.org", "ce.batch.org", "q")
NAME = "/".join(KEY)


def test_an_operator_retries_a_backed_off_queue_now(db: Database, settings: Settings,
                                                    tmp_path: Path) -> None:
    resources = batch_resources(tmp_path, batch_ce(executor="fake", ce=KEY[1], queue=KEY[2]))
    ctx = AgentContext(agent_settings(settings, tmp_path, resources, failure_backoff=600),
                       db.factory, secret=SECRET)
    submit_jobs(ctx, echo_jobs(KEY[0], 3))
    ces = FakeCEs(ctx, failing="batch system down")
    director = Director(ctx, ces)
    assert "batch system down" in director.cycle().failed[NAME]
    # The pilots loop failed too: a poll back-off of the queue, and this process leaves the
    # CE alone (its own back-off, in memory).
    ctx.transaction(partial(record_ce_failure, queues=[KEY], reason="qstat: timed out",
                            now=ctx.now(), base_backoff=600))
    (target,) = targets(ctx)
    ces.failed(target.compute)
    skipped = director.cycle().skipped[NAME]
    assert "1 failed submission(s) in a row, last: batch system down" in skipped
    assert "1 failed poll(s) of its CE in a row, last: qstat: timed out" in skipped

    env = {"GRIDPILOT_DATABASE_URL": db.url}
    wrong = run(["director", "retry", "Test.Batch.org/q"], tmp_path, **env)
    assert wrong.returncode == 2 and "a queue is SITE/CE/QUEUE" in wrong.stderr, wrong.stderr
    unknown = run(["director", "retry", "Test.Batch.org/ce.batch.org/nowhere"], tmp_path, **env)
    assert unknown.returncode == 1 and "no record of queue" in unknown.stderr, unknown.stderr
    assert "Traceback" not in unknown.stderr + wrong.stderr
    done = run(["director", "retry", NAME, "--by", "olga"], tmp_path, **env)
    assert done.returncode == 0, done.stderr
    assert f"{NAME}: tried again at the director's next cycle" in done.stdout

    state = director_queue(db, *KEY)
    assert (state.failures, state.poll_failures, state.poll_skip_until) == (0, 0, None)
    assert state.retry_requested_by == "olga" and state.retry_requested_at is not None
    # The next cycle tries the queue: the CE is back, its pilots are submitted.
    ces.failing = ""
    report = director.cycle()
    assert report.submitted == {NAME: 3} and not report.skipped, report.line()
