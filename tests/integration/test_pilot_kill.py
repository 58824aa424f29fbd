"""An operator kills a pilot started by hand, through the API of a real matcher: the pilot
stops its payload (which ignores SIGTERM, so SIGKILL after --grace), hands the job back, and
exits with EXIT_KILLED; the job is rescheduled exactly once, and no later match gives that
pilot a job."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import requests

from matcher.auth import issue_token
from pilot.loop import EXIT_KILLED, KILLED_BY_MATCHER
from pilot.protocol import JOB_STATUS_PATH
from tests.integration.holdproxy import holding_proxy
from tests.integration.pilots import payload_processes, running
from tests.integration.test_pilot import SECRET, SITE, Grid, _finish, grid

__all__ = ["grid"]

#: A payload that ignores SIGTERM, notes its pid, and would run for ten minutes.
STUBBORN = '''\
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(os.getcwd(), "pid"), "w") as f:
    f.write(str(os.getpid()))
time.sleep(600)
with open(sys.argv[1], "w") as f:
    f.write("ended by itself")
'''


def submit_stubborn(grid: Grid, tmp_path: Path) -> tuple[int, Path]:
    """A job running STUBBORN; returns its id and the file it writes if it ends by itself."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN, encoding="utf-8")
    ended = tmp_path / "ended"
    jdl = (f'[ Executable = "{sys.executable}"; Arguments = "{script} {ended}"; '
           'CPUTime = 600 ]')
    response = grid.user.post(f"{grid.base}/api/v1/jobs", data=jdl.encode(),
                              headers={"Content-Type": "text/plain"}, timeout=30)
    assert response.status_code == 201, response.text
    (job_id,) = response.json()["job_ids"]
    return int(job_id), ended


def stubborn_processes(grid: Grid, job_id: int, proc: subprocess.Popen[str]) -> dict[int, int]:
    """The processes of the job's payload under the pilot ``proc``, once it noted its pid."""
    pid_file = grid.tmp / "work" / f"job_{job_id}" / "pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the payload never started"
        time.sleep(0.1)
    processes = payload_processes(proc.pid, pid_file.parent)
    assert processes, "the payload's processes were not found"
    return processes


def test_a_pilot_killed_by_the_operator_stops_and_its_job_is_rescheduled_once(
        grid: Grid, tmp_path: Path) -> None:
    job_id, ended = submit_stubborn(grid, tmp_path)
    proc = grid.pilot("--cores", "1", "--idle-timeout", "60")
    try:
        grid.wait_status(job_id, {"Running"})
        reference = grid.job(job_id)["pilot_reference"]
        processes = stubborn_processes(grid, job_id, proc)
        operator = {"Authorization": "Bearer " + issue_token(
            SECRET, subject="olga", role="operator", vo="lhcb", group="lhcb_admin",
            lifetime=3600)}
        killed = requests.post(f"{grid.base}/api/v1/pilots/{reference}/kill",
                               headers=operator, timeout=30)
        assert killed.status_code == 202, killed.text
        code, out = _finish(proc, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == EXIT_KILLED, out
    assert KILLED_BY_MATCHER in out
    assert "1 handed back for rescheduling" in out
    # The payload is gone, killed before it could end by itself.
    assert running(processes) == []
    assert not ended.exists()
    job = grid.job(job_id)
    assert (job["status"], job["reschedule_count"]) == ("Waiting", 1), job
    assert [h["status"] for h in job["history"]].count("Rescheduled") == 1
    # The killed pilot (it registered itself, then said it was Aborted) gets nothing more.
    pilot = requests.get(f"{grid.base}/api/v1/pilots/{reference}", headers=operator,
                         timeout=30).json()
    assert pilot["status"] == "Aborted" and pilot["kill_requested_by"] == "olga"
    assert [j["job_id"] for j in pilot["jobs"]] == [job_id]
    pilot_http = {"Authorization": f"Bearer {grid.pilot_token}"}
    for _ in range(2):
        answer = requests.post(f"{grid.base}/api/v1/pilots/match", headers=pilot_http,
                               json={"resource": {"vo": "lhcb", "site": SITE,
                                                  "pilot_reference": reference}},
                               timeout=30).json()
        assert answer["jobs"] == [] and answer["no_match"]["reason"] == "pilot_killed"
    job = grid.job(job_id)
    assert (job["status"], job["reschedule_count"]) == ("Waiting", 1), job


def test_a_payload_whose_start_the_matcher_refuses_is_stopped_at_once(
        grid: Grid, tmp_path: Path) -> None:
    """A pilot's Running report held up in the network until the job went back and another
    pilot took it (the watchdog's matched lease, an owner's reschedule): when the report
    arrives and is refused, the pilot stops that payload then and there, not after it ran
    (a job run twice, on two nodes)."""
    job_id, ended = submit_stubborn(grid, tmp_path)
    status_path = "/api/v1" + JOB_STATUS_PATH.format(job_id=job_id)

    def running_report(method: str, path: str, body: bytes) -> bool:
        return method == "POST" and path == status_path and b'"Running"' in body

    with holding_proxy(grid.base, running_report) as (proxy, holding):
        # Heartbeats far apart: what stops the payload is the refusal, not a kill command.
        proc = grid.pilot("--matcher", proxy, "--cores", "1", "--idle-timeout", "4",
                          "--heartbeat", "60")
        try:
            assert holding.arrived.wait(timeout=60), "the pilot never reported Running"
            processes = stubborn_processes(grid, job_id, proc)
            reference = grid.job(job_id)["pilot_reference"]
            # Meanwhile the job goes back to its queue and another pilot takes it.
            back = grid.user.post(f"{grid.base}/api/v1/jobs/{job_id}/reschedule",
                                  json={"reason": "its pilot is silent"}, timeout=30)
            assert back.status_code == 200, back.text
            other = requests.post(
                f"{grid.base}/api/v1/pilots/match",
                headers={"Authorization": f"Bearer {grid.pilot_token}"},
                json={"resource": {"vo": "lhcb", "site": SITE, "cores": 1,
                                   "pilot_reference": "another-pilot"}}, timeout=30).json()
            assert [j["job_id"] for j in other["jobs"]] == [job_id], other
            holding.release.set()
            code, out = _finish(proc, timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert f"job {job_id} is not this pilot's to run any more" in out, out
    # Stopped by the refusal (SIGKILL after --grace: it ignores SIGTERM), not run to its end.
    assert running(processes) == []
    assert not ended.exists()
    job = grid.job(job_id)
    assert (job["status"], job["pilot_reference"]) == ("Matched", "another-pilot"), job
    assert reference != "another-pilot"
    # Nothing the first pilot said moved the job: no Running, no end.
    statuses = [h["status"] for h in job["history"]]
    assert statuses[-1] == "Matched" and "Running" not in statuses, statuses
    assert code == 0, out
