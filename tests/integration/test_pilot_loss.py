"""A pilot lost mid-payload, on every database: real pilots against a real matcher.

A pilot killed with SIGKILL (and its payload's process group with it) stops heartbeating; the
watchdog marks its job Stalled after ``agents.job_lease``, reschedules it after
``agents.stalled_limit`` more, and another pilot runs it to the end. A pilot whose record says it
is dead (Lost, Failed) has its jobs rescheduled at once, without waiting for the leases.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests

from agents.context import AgentContext
from agents.watchdog import watch_jobs
from gridpilot.devserver import matcher_server
from pilot.reaper import read_proc
from taskqueue.core.settings import MatcherSettings, ResourcesSettings, Settings
from taskqueue.pilots.records import set_pilot_status
from taskqueue.tokens import issue_token
from tests.conftest import Database
from tests.helpers import write_token_file
from tests.integration.pilots import payload_processes, start_pilot

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = ROOT / "conf" / "resources.toml"
SECRET = "pilot-loss-integration-secret-0123456789"
SITE, CE, QUEUE = "DIRAC.Demo.local", "localhost", "local"

#: The first attempt hangs (until it is killed); any later attempt ends at once. Each attempt
#: leaves its pid (its process group: the pilot starts payloads in their own session) in its
#: work directory and a line in the attempts file.
PAYLOAD = '''\
import os, sys, time
attempts = sys.argv[1]
with open("pid", "w") as f:
    f.write(str(os.getpid()))
try:
    with open(attempts) as f:
        attempt = len(f.read().splitlines()) + 1
except FileNotFoundError:
    attempt = 1
with open(attempts, "a") as f:
    f.write(f"{attempt} {os.environ['GRIDPILOT_JOB_ID']} {os.getpid()}\\n")
if attempt == 1:
    time.sleep(600)
print("attempt", attempt, "finished")
'''


class OffsetClock:
    """The real time, moved forward at will: the watchdog sees the leases run out without the
    test waiting for them."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


@dataclass
class Grid:
    base: str
    tmp: Path
    user: requests.Session
    script: Path
    attempts: Path

    def submit(self) -> int:
        jdl = (f'[ Executable = "{sys.executable}"; Arguments = "{self.script} {self.attempts}"; '
               f'CPUTime = 600; Site = "{SITE}" ]')
        response = self.user.post(f"{self.base}/api/v1/jobs", data=jdl.encode(),
                                  headers={"Content-Type": "text/plain"}, timeout=30)
        assert response.status_code == 201, response.text
        (job_id,) = response.json()["job_ids"]
        assert isinstance(job_id, int)
        return job_id

    def job(self, job_id: int) -> dict[str, Any]:
        response = self.user.get(f"{self.base}/api/v1/jobs/{job_id}", timeout=30)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    def wait_status(self, job_id: int, statuses: set[str], timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job["status"] in statuses:
                return job
            assert time.monotonic() < deadline, f"job {job_id} never reached {statuses}: {job}"
            time.sleep(0.1)

    def pilot(self, reference: str, idle_timeout: float) -> subprocess.Popen[bytes]:
        """A real pilot process at the demo site, with a token that speaks for it alone."""
        token = issue_token(SECRET, subject=reference, role="pilot", vo="lhcb",
                            group="lhcb_pilot", lifetime=3600, site=SITE, pilot=reference)
        env = dict(os.environ)
        for name in ("MACHINEFEATURES", "JOBFEATURES", "JOBSTATUS"):
            env.pop(name, None)
        token_file = write_token_file(self.tmp / f"{reference}.token", token)
        with (self.tmp / f"{reference}.log").open("wb") as log:
            return start_pilot(
                [sys.executable, "-m", "pilot.cli", "--matcher", self.base, "--vo", "lhcb",
                 "--site", SITE, "--ce", CE, "--queue", QUEUE, "--reference", reference,
                 "--cores", "1", "--workdir", str(self.tmp / reference),
                 "--heartbeat", "0.5", "--grace", "2", "--backoff-cap", "1", "--margin", "0",
                 "--idle-timeout", str(idle_timeout), "--token-file", str(token_file)],
                env=env, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT)

    def log(self, reference: str) -> str:
        return (self.tmp / f"{reference}.log").read_text(errors="replace")


@pytest.fixture()
def grid(db: Database, tmp_path: Path) -> Iterator[Grid]:
    with matcher_server(db.url, SECRET, RESOURCES, tmp_path) as base:
        user = requests.Session()
        user.headers["Authorization"] = "Bearer " + issue_token(
            SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user", lifetime=3600)
        script = tmp_path / "payload.py"
        script.write_text(PAYLOAD, encoding="utf-8")
        with user:
            yield Grid(base, tmp_path, user, script, tmp_path / "attempts.txt")


def agent_context(db: Database, settings: Settings, base: str, clock: Callable[[], datetime],
                  **leases: Any) -> AgentContext:
    s = replace(settings, resources=ResourcesSettings(file=str(RESOURCES)),
                matcher=MatcherSettings(url=base), agents=replace(settings.agents, **leases))
    return AgentContext(s, db.factory, secret=SECRET, clock=clock)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def gone(pid: int) -> bool:
    """The process no longer runs (it does not exist, or is a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def reference(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def kill_mid_payload(grid: Grid, job_id: int, first: str) -> subprocess.Popen[bytes]:
    """Start the first pilot, wait until it runs the job, SIGKILL it and its payload's process
    group; returns the dead pilot's process."""
    proc = grid.pilot(first, idle_timeout=60)
    try:
        job = grid.wait_status(job_id, {"Running"})
        assert job["pilot_reference"] == first
        pid_file = grid.tmp / first / f"job_{job_id}" / "pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "",
                 f"the payload's pid file {pid_file}")
        (payload_pid,) = [pid for pid in payload_processes(proc.pid, pid_file.parent)
                          if (seen := read_proc(pid)) is not None and seen.ppid == proc.pid]
        # The payload (or its sandbox) leads its own process group, in its own session,
        # under the pilot.
        assert os.getpgid(payload_pid) == payload_pid
        assert int(Path(f"/proc/{payload_pid}/stat").read_text().rsplit(")", 1)[1]
                   .split()[1]) == proc.pid
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    os.killpg(payload_pid, signal.SIGKILL)
    wait_for(lambda: gone(payload_pid), f"the payload {payload_pid} to die")
    # Killed with its pilot, the payload reported nothing: the job is still Running.
    assert grid.job(job_id)["status"] == "Running"
    return proc


def complete_with_second_pilot(grid: Grid, job_id: int, first: str) -> None:
    second = reference("second")
    proc = grid.pilot(second, idle_timeout=2)
    try:
        job = grid.wait_status(job_id, {"Done", "Failed"}, timeout=60)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, grid.log(second)
    assert job["status"] == "Done", (job, grid.log(second))
    assert job["exit_code"] == 0
    assert job["pilot_reference"] == second != first
    output = grid.user.get(f"{grid.base}/api/v1/jobs/{job_id}/output", timeout=30).json()
    assert "attempt 2 finished" in output["output_tail"]
    attempts = [line.split() for line in grid.attempts.read_text().splitlines()]
    assert [(a[0], a[1]) for a in attempts] == [("1", str(job_id)), ("2", str(job_id))]


def statuses(job: dict[str, Any]) -> list[str]:
    return [h["status"] for h in job["history"]]


def test_a_pilot_killed_mid_payload_leaves_a_stalled_job_that_another_pilot_completes(
        grid: Grid, db: Database, settings: Settings) -> None:
    clock = OffsetClock()
    ctx = agent_context(db, settings, grid.base, clock, job_lease=2, stalled_limit=2,
                        matched_lease=2)
    job_id = grid.submit()
    first = reference("first")
    kill_mid_payload(grid, job_id, first)

    clock.offset = timedelta(seconds=3)  # past job_lease since the last heartbeat
    summary = watch_jobs(ctx)
    job = grid.job(job_id)
    assert job["status"] == "Stalled", (summary, job)
    assert job["pilot_reference"] == first and job["reschedule_count"] == 0
    assert summary.startswith("1 stalled, 0 rescheduled"), summary

    # Stalled for stalled_limit longer: rescheduled, through the chain, Waiting again.
    deadline = time.monotonic() + 30
    while (job := grid.job(job_id))["status"] != "Waiting":
        assert job["status"] == "Stalled", job
        assert time.monotonic() < deadline, f"job {job_id} never rescheduled: {job}"
        clock.offset += timedelta(seconds=1)
        watch_jobs(ctx)
    assert job["reschedule_count"] == 1
    history = statuses(job)
    assert "Stalled" in history and "Rescheduled" in history, history
    assert history.index("Stalled") < history.index("Rescheduled") < len(history) - 1
    assert history[-1] == "Waiting"
    # Another cycle finds nothing more to do: one silence, one reschedule.
    clock.offset += timedelta(seconds=60)
    assert watch_jobs(ctx).startswith("0 stalled, 0 rescheduled, 0 of dead pilots")
    assert grid.job(job_id)["reschedule_count"] == 1

    complete_with_second_pilot(grid, job_id, first)


@pytest.mark.parametrize("dead", ["Lost", "Failed"])
def test_the_job_of_a_pilot_known_dead_is_rescheduled_at_once(
        grid: Grid, db: Database, settings: Settings, dead: str) -> None:
    clock = OffsetClock()
    # Leases far away: only the pilot's record can get the job rescheduled now.
    ctx = agent_context(db, settings, grid.base, clock, job_lease=3600, stalled_limit=3600,
                        matched_lease=3600)
    job_id = grid.submit()
    first = reference("first")
    kill_mid_payload(grid, job_id, first)

    assert watch_jobs(ctx).startswith("0 stalled, 0 rescheduled, 0 of dead pilots")
    assert grid.job(job_id)["status"] == "Running"

    assert ctx.transaction(partial(set_pilot_status, reference=first, status=dead,
                                   now=clock(), reason="killed by the test"))
    summary = watch_jobs(ctx)
    assert "1 of dead pilots rescheduled" in summary, summary
    job = grid.job(job_id)
    assert job["status"] == "Waiting", (summary, job)
    assert job["reschedule_count"] == 1
    history = statuses(job)
    assert "Stalled" not in history, history
    assert "Rescheduled" in history and history.index("Running") < history.index("Rescheduled")
    assert any(first in (h["minor_status"] or "") and dead in (h["minor_status"] or "")
               for h in job["history"] if h["status"] == "Rescheduled"), job["history"]
    # The dead pilot's record does not reschedule the job a second time.
    assert "0 of dead pilots rescheduled" in watch_jobs(ctx)

    complete_with_second_pilot(grid, job_id, first)
