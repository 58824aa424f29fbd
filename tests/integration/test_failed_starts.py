"""Pilots that die at start (issue 34 item 3), on every backend: with the pilot command exiting
3 on the worker node and 5 waiting jobs, the real ``gridpilot agents`` (the director and the
pilots loop, PSI/J's local executor starting real processes) stops submitting to the queue
after ``[agents] failed_starts`` pilots in a row ended before they reached the matcher, says
why (``gridpilot director status``, the director's report), and submits again once an
operator retries the queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from agents.context import AgentContext
from taskqueue.core.settings import Settings
from tests.conftest import Database
from tests.integration.test_cli import run
from tests.integration.test_director import (
    NOWHERE,
    SECRET,
    agent_settings,
    by_status,
    director_queue,
    echo_jobs,
    pilots,
    submit_jobs,
    wait_until,
    write_resources,
)

SITE, CE, QUEUE = "Test.Start.org", "local.start.org", "q"
NAME = f"{SITE}/{CE}/{QUEUE}"

RESOURCES = f"""\
[JobDescription]
VO = "list"
Platform = "list"

[Sites."{SITE}"]
VO = "lhcb"
Platform = "x86_64-el9"

[Sites."{SITE}".CEs."{CE}"]
Executor = "local"
MaxCPUTime = 1440

[Sites."{SITE}".CEs."{CE}".Queues.{QUEUE}]
NumberOfProcessors = 1
"""

#: What ``gridpilot agents`` may make at most with every pilot dying at start (the issue's
#: figure): the first cycle's pilots for the 5 jobs, and none after the stop.
MOST_RECORDS = 8


def test_pilots_dying_at_start_stop_the_queue_until_an_operator_retries(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    resources = write_resources(tmp_path, RESOURCES)
    ctx = AgentContext(agent_settings(settings, tmp_path, resources), db.factory,
                       secret=SECRET)
    submit_jobs(ctx, echo_jobs(SITE, 5))
    env = {**os.environ, "GRIDPILOT_DATABASE_URL": db.url, "GRIDPILOT_AUTH_SECRET": SECRET,
           "GRIDPILOT_RESOURCES_FILE": str(resources), "GRIDPILOT_MATCHER_URL": NOWHERE,
           "GRIDPILOT_AGENTS_PILOT_WORKDIR": str(tmp_path / "pilots"),
           "GRIDPILOT_AGENTS_PILOT_COMMAND": json.dumps(["/bin/sh", "-c", "exit 3"]),
           "GRIDPILOT_AGENTS_FAILED_STARTS": "4",
           "GRIDPILOT_AGENTS_DIRECTOR_INTERVAL": "1",
           "GRIDPILOT_AGENTS_PILOT_STATUS_INTERVAL": "1"}
    agents = subprocess.Popen([sys.executable, "-m", "gridpilot", "agents", "director",
                               "pilots"], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def stopped() -> bool:
            try:
                return director_queue(db, SITE, CE, QUEUE).failed_starts > 0
            except AssertionError:  # no row yet
                return False

        wait_until("the queue's submissions stop", stopped, timeout=150)
        state = director_queue(db, SITE, CE, QUEUE)
        assert state.starts_stopped_at is not None
        # The director goes on cycling over the queue, and submits nothing more to it.
        cycles: list[object] = []

        def cycled() -> bool:
            at = director_queue(db, SITE, CE, QUEUE).last_cycle_at
            if at is not None and at > state.starts_stopped_at and at not in cycles:
                cycles.append(at)
            return len(cycles) >= 3

        wait_until("three more cycles of the director", cycled, timeout=60)
    finally:
        agents.send_signal(signal.SIGTERM)
        out, _ = agents.communicate(timeout=60)
    rows = pilots(db)
    assert len(rows) <= MOST_RECORDS, (by_status(rows), out)
    assert by_status(rows) == {"Failed": len(rows)}, out
    assert all(p.native_id and p.last_seen_at is None for p in rows)
    assert {p.exit_code for p in rows} == {3}, [(p.exit_code, p.reason) for p in rows]
    state = director_queue(db, SITE, CE, QUEUE)
    assert state.failed_starts == 4, state.starts_error
    assert "the last 4 pilots ended before they reached the matcher" in state.starts_error
    assert "exit code 3" in state.starts_error
    assert f"{NAME} skipped (the last 4 pilots ended before they reached the matcher" in out

    db_env = {"GRIDPILOT_DATABASE_URL": db.url}
    status = run(["director", "status"], tmp_path, **db_env)
    assert status.returncode == 0, status.stderr
    assert f"{NAME}: the last 4 pilots ended before they reached the matcher" in status.stdout
    assert "exit code 3" in status.stdout

    # The operator fixed the node (or not): a retry lifts the stop, and the next cycle
    # submits the queue's pilots again.
    assert run(["director", "retry", NAME], tmp_path, **db_env).returncode == 0
    assert director_queue(db, SITE, CE, QUEUE).failed_starts == 0
    assert f"{NAME}: submits" in run(["director", "status"], tmp_path, **db_env).stdout
    again = subprocess.run([sys.executable, "-m", "gridpilot", "agents", "director", "--once"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"director: 5 pilot(s) submitted; 5 to {NAME}" in again.stdout, again.stdout
