"""The whole pilot against a real matcher on loopback, running real payload subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gridpilot import schema
from gridpilot.devserver import free_port, matcher_server
from matcher.auth import issue_token
from pilot.features import write_features
from taskqueue.db.database import make_engine
from tests.helpers import write_token_file
from tests.integration.pilots import payload_processes, running, start_pilot

ROOT = Path(__file__).resolve().parents[2]
SECRET = "pilot-integration-secret-0123456789"
SITE, CE, QUEUE = "DIRAC.Demo.local", "localhost", "local"

#: A payload that records its start and end (time, cores, allocated_CPU from its own
#: $JOBFEATURES) in a shared file, then sleeps.
PAYLOAD = '''\
import os, sys, time
record, seconds = sys.argv[1], float(sys.argv[2])
cores = os.environ["GRIDPILOT_JOB_CORES"]
with open(os.path.join(os.environ["JOBFEATURES"], "allocated_CPU")) as f:
    allocated = f.read().strip()
with open(os.path.join(os.getcwd(), "pid"), "w") as f:
    f.write(str(os.getpid()))
def note(what):
    with open(record, "a") as f:
        f.write(f"{what} {time.time()} {cores} {allocated} {os.environ['GRIDPILOT_JOB_ID']}\\n")
note("start")
time.sleep(seconds)
note("end")
print("payload finished after", seconds, "s")
'''


class Grid:
    """A matcher on an SQLite database, with tokens and helpers to submit and inspect."""

    def __init__(self, base: str, tmp: Path) -> None:
        self.base = base
        self.tmp = tmp
        self.user = requests.Session()
        self.user.headers["Authorization"] = "Bearer " + issue_token(
            SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user", lifetime=3600)
        self.pilot_token = issue_token(SECRET, subject="pilots", role="pilot", vo="lhcb",
                                       group="lhcb_pilot", lifetime=3600, site=SITE)
        self.script = tmp / "payload.py"
        self.script.write_text(PAYLOAD, encoding="utf-8")
        self.record = tmp / "record.txt"

    def submit(self, seconds: float, processors: int = 1, n: int = 1,
               memory: int | None = None) -> list[int]:
        jdl = (f'[ Executable = "{sys.executable}"; '
               f'Arguments = "{self.script} {self.record} {seconds}"; CPUTime = 600; '
               f'NumberOfProcessors = {processors}'
               + (f'; Parameters = {n}' if n > 1 else "")
               + (f'; MaxRAM = {memory}' if memory is not None else "") + ' ]')
        response = self.user.post(f"{self.base}/api/v1/jobs", data=jdl.encode(),
                                  headers={"Content-Type": "text/plain"}, timeout=30)
        assert response.status_code == 201, response.text
        ids: list[int] = response.json()["job_ids"]
        return ids

    def job(self, job_id: int) -> dict[str, Any]:
        response = self.user.get(f"{self.base}/api/v1/jobs/{job_id}", timeout=30)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    def wait_status(self, job_id: int, statuses: set[str], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.job(job_id)["status"] not in statuses:
            assert time.monotonic() < deadline, f"job {job_id} never reached {statuses}"
            time.sleep(0.2)

    def pilot(self, *args: str, features: tuple[Path | None, Path | None] = (None, None)
              ) -> subprocess.Popen[str]:
        env = dict(os.environ)
        token_file = write_token_file(self.tmp / "pilot.token", self.pilot_token)
        for name, path in zip(("MACHINEFEATURES", "JOBFEATURES"), features, strict=True):
            env.pop(name, None)
            if path is not None:
                env[name] = str(path)
        return start_pilot(
            [sys.executable, "-m", "pilot.cli", "--matcher", self.base, "--vo", "lhcb",
             "--site", SITE, "--ce", CE, "--queue", QUEUE, "--workdir", str(self.tmp / "work"),
             "--heartbeat", "0.5", "--grace", "2", "--backoff-cap", "1", "--margin", "0",
             "--token-file", str(token_file), *args],
            env=env, cwd=self.tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def intervals(self) -> list[tuple[float, float, int, int]]:
        starts: dict[str, tuple[float, int, int]] = {}
        out = []
        for line in self.record.read_text().splitlines():
            what, at, cores, allocated, job = line.split()
            if what == "start":
                starts[job] = (float(at), int(cores), int(allocated))
            else:
                t0, c, a = starts.pop(job)
                out.append((t0, float(at), c, a))
        return out


@pytest.fixture()
def grid(tmp_path: Path) -> Iterator[Grid]:
    url = f"sqlite:///{tmp_path / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", tmp_path) as base:
        yield Grid(base, tmp_path)


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def test_a_four_core_pilot_runs_jobs_of_1_2_and_4_cores_without_overcommitting(
        grid: Grid) -> None:
    jobs = grid.submit(1.5, 1, n=4) + grid.submit(1.5, 2, n=3) + grid.submit(1.0, 4, n=2)
    code, out = _finish(grid.pilot("--cores", "4", "--idle-timeout", "2",
                                   "--jobstatus", str(grid.tmp / "jobstatus")))
    assert code == 0, out
    assert all(grid.job(j)["status"] == "Done" for j in jobs), out
    intervals = grid.intervals()
    assert sorted(c for _, _, c, _ in intervals) == [1] * 4 + [2] * 3 + [4] * 2
    # Each payload's own $JOBFEATURES says the cores it was given.
    assert all(cores == allocated for _, _, cores, allocated in intervals)
    events = sorted([(t0, c) for t0, _, c, _ in intervals] + [(t1, -c) for _, t1, c, _ in
                                                             intervals],
                    key=lambda e: (e[0], e[1]))
    in_use, peak = 0, 0
    for _, delta in events:  # at equal times an end (negative) comes before a start
        in_use += delta
        peak = max(peak, in_use)
    assert peak <= 4
    overlapping = [(a, b) for a in intervals for b in intervals
                   if a is not b and a[0] < b[1] and b[0] < a[1]]
    assert overlapping, "payloads never ran at the same time"
    # An exited pilot leaves no $JOBSTATUS: the site's drain-cost tool lists live pilots.
    assert not (grid.tmp / "jobstatus").exists()
    output = requests.get(f"{grid.base}/api/v1/jobs/{jobs[0]}/output",
                          headers=grid.user.headers, timeout=30).json()
    assert output["exit_code"] == 0 and "payload finished" in output["output_tail"]


def test_a_pilot_never_runs_jobs_needing_more_memory_than_it_has_at_once(grid: Grid) -> None:
    # 2 cores and 4,000 MB: two 3,000 MB jobs never run side by side (the second core's
    # share would be 2,000 MB, but 1,000 MB is what the first job leaves); whichever job
    # comes first, a second one fits beside it, so two jobs do run at the same time.
    big = grid.submit(1.5, 1, n=2, memory=3000)
    small = grid.submit(1.5, 1, n=2, memory=1000)
    code, out = _finish(grid.pilot("--cores", "2", "--memory", "4000", "--idle-timeout", "3"))
    assert code == 0, out
    assert all(grid.job(j)["status"] == "Done" for j in big + small), out
    memory = {str(j): 3000 for j in big} | {str(j): 1000 for j in small}
    events = []
    for line in grid.record.read_text().splitlines():
        what, at, _cores, _allocated, job = line.split()
        events.append((float(at), memory[job] if what == "start" else -memory[job]))
    in_use, peak, running, most = 0, 0, 0, 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts
        in_use += delta
        running += 1 if delta > 0 else -1
        peak, most = max(peak, in_use), max(most, running)
    assert peak <= 4000
    assert most == 2, "the payloads never ran side by side"


def test_shutdowntime_stops_matching_and_hands_running_jobs_back(grid: Grid) -> None:
    machine = grid.tmp / "machinefeatures"
    write_features(machine, {"hs06": 40.0, "jobslots": 2, "log_cores": 2})
    first = grid.submit(60, 1, n=2)
    proc = grid.pilot("--cores", "2", "--idle-timeout", "30", features=(machine, None))
    for job_id in first:
        grid.wait_status(job_id, {"Running"})
    later = grid.submit(1, 1)
    write_features(machine, {"shutdowntime": int(time.time()) + 3})
    code, out = _finish(proc)
    assert code == 0, out
    for job_id in first:
        job = grid.job(job_id)
        assert job["status"] == "Waiting" and job["reschedule_count"] == 1, job
        assert any(h["status"] == "Rescheduled" for h in job["history"])
    # No job was matched after the shutdown time appeared: the late one still waits.
    assert grid.job(later[0])["status"] == "Waiting"
    assert "2 handed back for rescheduling" in out


def test_a_kill_from_the_matcher_kills_the_payload(grid: Grid) -> None:
    (job_id,) = grid.submit(120, 1)
    proc = grid.pilot("--cores", "1", "--idle-timeout", "2")
    grid.wait_status(job_id, {"Running"})
    pid_file = grid.tmp / "work" / f"job_{job_id}" / "pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    processes = payload_processes(proc.pid, pid_file.parent)
    assert processes, "the payload's processes were not found"
    killed = grid.user.post(f"{grid.base}/api/v1/jobs/{job_id}/kill", json={}, timeout=30)
    assert killed.status_code == 200, killed.text
    code, out = _finish(proc, timeout=60)
    assert code == 0, out
    assert running(processes) == []
    job = grid.job(job_id)
    assert job["status"] == "Killed" and job["exit_code"] is not None
    assert "1 killed" in out


def test_results_survive_the_matcher_going_down(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    port = free_port()
    resources = ROOT / "conf" / "resources.toml"
    with matcher_server(url, SECRET, resources, tmp_path, port=port) as base:
        grid = Grid(base, tmp_path)
        (job_id,) = grid.submit(3, 1)
        # A matcher silent for longer than --idle-timeout ends the pilot (see
        # test_pilot_ending.py): this one waits for a matcher down for 6 s.
        proc = grid.pilot("--cores", "1", "--idle-timeout", "20", "--report-timeout", "120")
        grid.wait_status(job_id, {"Running"})
    # The matcher is down while the payload ends and the pilot tries to report.
    time.sleep(6)
    assert proc.poll() is None, "the pilot gave up while the matcher was down"
    with matcher_server(url, SECRET, resources, tmp_path, port=port):
        code, out = _finish(proc)
        assert code == 0, out
        job = grid.job(job_id)
    assert job["status"] == "Done" and job["exit_code"] == 0


def test_a_running_jobs_output_tail_comes_with_the_heartbeats(grid: Grid) -> None:
    """A peek: what the payload printed is the job's output tail while it still runs."""
    script = grid.tmp / "peek.py"
    script.write_text("import time\nprint('peek-marker', flush=True)\ntime.sleep(120)\n",
                      encoding="utf-8")
    response = grid.user.post(
        f"{grid.base}/api/v1/jobs", timeout=30, headers={"Content-Type": "text/plain"},
        data=f'[ Executable = "{sys.executable}"; Arguments = "{script}"; CPUTime = 600 ]')
    assert response.status_code == 201, response.text
    (job_id,) = response.json()["job_ids"]
    proc = grid.pilot("--cores", "1", "--idle-timeout", "2")
    deadline = time.monotonic() + 60
    while True:
        output = grid.user.get(f"{grid.base}/api/v1/jobs/{job_id}/output", timeout=30).json()
        if "peek-marker" in (output["output_tail"] or ""):
            break
        assert time.monotonic() < deadline, f"no output tail while it ran: {output}"
        time.sleep(0.2)
    assert output["status"] == "Running" and output["exit_code"] is None
    killed = grid.user.post(f"{grid.base}/api/v1/jobs/{job_id}/kill", json={}, timeout=30)
    assert killed.status_code == 200, killed.text
    code, out = _finish(proc, timeout=60)
    assert code == 0, out
    assert " ERROR " not in out, out


#: A payload that writes the GPUs it sees to ``<folder>/<job id>`` and then waits until every
#: one of ``expected`` payloads has written its own: it ends 0 only if they ran side by side.
GPU_PAYLOAD = '''\
import os, sys, time
folder, expected = sys.argv[1], int(sys.argv[2])
seen = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
others = [os.environ.get(n) for n in ("ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK",
                                      "GRIDPILOT_JOB_GPUS")]
with open(os.path.join(folder, os.environ["GRIDPILOT_JOB_ID"]), "w") as f:
    f.write(seen if others == [seen] * 3 else "variables differ: %r %r" % (seen, others))
deadline = time.monotonic() + 60
while len(os.listdir(folder)) < expected and time.monotonic() < deadline:
    time.sleep(0.1)
sys.exit(0 if len(os.listdir(folder)) >= expected else 3)
'''


def test_gpu_jobs_wait_for_a_pilot_with_gpus_and_each_gets_its_own(grid: Grid) -> None:
    script, seen = grid.tmp / "gpu_payload.py", grid.tmp / "gpus-seen"
    script.write_text(GPU_PAYLOAD, encoding="utf-8")
    seen.mkdir()
    jdl = (f'[ Executable = "{sys.executable}"; Arguments = "{script} {seen} 2"; '
           'CPUTime = 600; NumberOfGPUs = 1; Parameters = 2 ]')
    response = grid.user.post(f"{grid.base}/api/v1/jobs", data=jdl.encode(),
                              headers={"Content-Type": "text/plain"}, timeout=30)
    assert response.status_code == 201, response.text
    jobs: list[int] = response.json()["job_ids"]
    for job in jobs:
        grid.wait_status(job, {"Waiting"})
    code, out = _finish(grid.pilot("--cores", "2", "--idle-timeout", "2"))
    assert code == 0, out
    assert [grid.job(j)["status"] for j in jobs] == ["Waiting", "Waiting"], out
    assert list(seen.iterdir()) == []
    code, out = _finish(grid.pilot("--cores", "2", "--gpus", "0,1", "--idle-timeout", "2"))
    assert code == 0, out
    assert [grid.job(j)["status"] for j in jobs] == ["Done", "Done"], out
    assert {path.read_text() for path in seen.iterdir()} == {"0", "1"}
