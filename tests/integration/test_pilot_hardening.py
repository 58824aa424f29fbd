"""A real pilot against a real matcher on loopback, attacked by its own payloads and by a
careless site: what payloads can read, what they leave behind, how the pilot ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gridpilot import schema
from gridpilot.devserver import free_port, matcher_server
from matcher.auth import issue_token
from pilot.features import write_features
from taskqueue.db.database import make_engine
from taskqueue.pilots.pilotlogs import part_for_owner
from tests.helpers import write_token_file
from tests.integration.pilots import start_pilot
from tests.integration.test_pilot import ROOT, SECRET, Grid

#: A payload that looks for its pilot's token wherever a process of the same user can:
#: the environment and command line of each of its ancestors (the kernel shows the initial
#: environment in /proc/<pid>/environ), their memory, and the token file.
SNOOP = '''\
import json, os, sys
result, token_file = sys.argv[1], sys.argv[2]
seen = {}
pid = os.getppid()
while pid > 1:
    for what in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                seen[f"{pid}/{what}"] = f.read().decode("utf-8", "replace")
        except OSError as exc:
            seen[f"{pid}/{what}"] = f"unreadable: {exc.strerror}"
    try:
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        break
try:
    with open(token_file) as f:
        seen["token file"] = f.read()
except OSError as exc:
    seen["token file"] = f"unreadable: {exc.strerror}"
seen["environment"] = json.dumps(dict(os.environ))
with open(result, "w") as f:
    json.dump(seen, f)
'''


@pytest.fixture()
def grid(tmp_path: Path) -> Iterator[Grid]:
    url = f"sqlite:///{tmp_path / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", tmp_path) as base:
        yield Grid(base, tmp_path)


def submit(grid: Grid, executable: str, arguments: str, **fields: str) -> int:
    extra = "".join(f"; {k} = {v}" for k, v in fields.items())
    jdl = (f'[ Executable = "{executable}"; Arguments = "{arguments}"; CPUTime = 600'
           f'{extra} ]')
    response = grid.user.post(f"{grid.base}/api/v1/jobs", data=jdl.encode(),
                              headers={"Content-Type": "text/plain"}, timeout=30)
    assert response.status_code == 201, response.text
    (job_id,) = response.json()["job_ids"]
    return int(job_id)


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


# -- item 4: the token ----------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_a_payload_finds_the_pilot_token_nowhere(grid: Grid, isolation: str) -> None:
    script = grid.tmp / "snoop.py"
    script.write_text(SNOOP, encoding="utf-8")
    result = grid.tmp / "seen.json"
    token_file = grid.tmp / "pilot.token"
    job_id = submit(grid, sys.executable, f"{script} {result} {token_file}")
    proc = grid.pilot("--cores", "1", "--idle-timeout", "2", "--isolation", isolation)
    code, out = finish(proc)
    assert code == 0, out
    assert grid.job(job_id)["status"] == "Done", out
    seen = json.loads(result.read_text())
    if "payloads run isolated" in out:
        # In its sandbox's PID namespace the payload sees no process above it: not the pilot.
        assert not [k for k in seen if k.endswith("/environ")], seen.keys()
    else:
        # The payload did look at the pilot (its parent) and beyond.
        assert isolation == "none", out
        assert f"{proc.pid}/environ" in seen and f"{proc.pid}/cmdline" in seen
        assert len([k for k in seen if k.endswith("/environ")]) >= 2
    leaks = [where for where, text in seen.items() if grid.pilot_token in text]
    assert not leaks, f"the payload read the pilot token in {leaks}"
    assert seen["token file"].startswith("unreadable"), "the token file was left behind"
    assert not token_file.exists()


def test_a_token_in_the_environment_is_refused(grid: Grid, tmp_path: Path) -> None:
    env = {**os.environ, "GRIDPILOT_PILOT_TOKEN": grid.pilot_token}
    proc = subprocess.run(
        [sys.executable, "-m", "pilot.cli", "--matcher", grid.base, "--vo", "lhcb",
         "--workdir", str(tmp_path / "work")],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "GRIDPILOT_PILOT_TOKEN" in proc.stderr and "--token-file" in proc.stderr


def test_a_token_file_readable_by_others_is_refused(grid: Grid, tmp_path: Path) -> None:
    token_file = write_token_file(tmp_path / "open.token", grid.pilot_token)
    token_file.chmod(0o644)
    proc = subprocess.run(
        [sys.executable, "-m", "pilot.cli", "--matcher", grid.base, "--vo", "lhcb",
         "--workdir", str(tmp_path / "work"), "--token-file", str(token_file)],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "readable by others" in proc.stderr and "0600" in proc.stderr


def test_a_token_from_an_inherited_descriptor(grid: Grid) -> None:
    job_id = submit(grid, "/bin/echo", "hello")
    read, write = os.pipe()
    os.write(write, grid.pilot_token.encode() + b"\n")
    os.close(write)
    env = dict(os.environ)
    try:
        proc = start_pilot(
            [sys.executable, "-m", "pilot.cli", "--matcher", grid.base, "--vo", "lhcb",
             "--site", "DIRAC.Demo.local", "--ce", "localhost", "--queue", "local",
             "--workdir", str(grid.tmp / "work"), "--idle-timeout", "2", "--margin", "0",
             "--backoff-cap", "1", "--token-fd", str(read)],
            env=env, cwd=grid.tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, pass_fds=(read,))
    finally:
        os.close(read)
    code, out = finish(proc)
    assert code == 0, out
    assert grid.job(job_id)["status"] == "Done", out
    output = requests.get(f"{grid.base}/api/v1/jobs/{job_id}/output",
                          headers=grid.user.headers, timeout=30).json()
    assert "hello" in output["output_tail"]


# -- item 5: a payload's processes end with it ----------------------------------------------

#: A payload that leaves processes behind: one in its session, one in a session of its own,
#: and one in a session of its own that burns CPU time before it sleeps. Each writes its pid.
LEAVER = '''\
pids=$1 burned=$2 linger=$3
sh -c 'echo $$ >> "$0"; exec sleep 300' "$pids" &
setsid sh -c 'echo $$ >> "$0"; exec sleep 301' "$pids" &
setsid sh -c 'echo $$ >> "$0"; i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done
              echo done > "$1"; exec sleep 302' "$pids" "$burned" &
while [ ! -e "$burned" ] || [ "$(wc -l < "$pids")" -lt 3 ]; do sleep 0.1; done
exec sleep "$linger"
'''


def _alive(pid: int) -> bool:
    """Whether the process is still there (a zombie waiting for its parent counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and b"sleep" in cmdline


def _leaver(grid: Grid, linger: int) -> tuple[int, Path]:
    script = grid.tmp / "leaver.sh"
    script.write_text(LEAVER, encoding="utf-8")
    pids = grid.tmp / "pids"
    return submit(grid, "/bin/sh", f"{script} {pids} {grid.tmp / 'burned'} {linger}"), pids


def _wait_lines(path: Path, n: int, proc: subprocess.Popen[str]) -> list[int]:
    deadline = time.monotonic() + 60
    while not path.exists() or len(path.read_text().split()) < n:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the payload never started its processes"
        time.sleep(0.1)
    return [int(p) for p in path.read_text().split()]


def test_what_a_payload_leaves_running_ends_with_it_and_its_cpu_time_counts(
        grid: Grid) -> None:
    job_id, pids = _leaver(grid, linger=0)
    proc = grid.pilot("--cores", "1", "--idle-timeout", "5")
    started = _wait_lines(pids, 3, proc)
    code, out = finish(proc)
    assert code == 0, out
    job = grid.job(job_id)
    assert job["status"] == "Done", out
    left = [pid for pid in started if _alive(pid)]
    assert not left, f"processes {left} outlived their payload"
    # The CPU time the setsid'ed process burned before it slept is the payload's.
    assert job["cpu_used"] is not None and job["cpu_used"] > 0.05, job


def test_a_stopped_pilot_ends_every_process_of_its_payloads(grid: Grid) -> None:
    job_id, pids = _leaver(grid, linger=600)
    proc = grid.pilot("--cores", "1", "--idle-timeout", "60")
    started = _wait_lines(pids, 3, proc)
    grid.wait_status(job_id, {"Running"})
    proc.terminate()
    code, out = finish(proc)
    assert code == 0, out
    left = [pid for pid in started if _alive(pid)]
    assert not left, f"processes {left} outlived the pilot"
    assert grid.job(job_id)["status"] == "Waiting"  # handed back for rescheduling


# -- item 11: exit codes ----------------------------------------------------------------------


def _lone_pilot(matcher: str, token: str, tmp: Path,
                *args: str) -> subprocess.CompletedProcess[str]:
    token_file = write_token_file(tmp / "lone.token", token)
    return subprocess.run(
        [sys.executable, "-m", "pilot.cli", "--matcher", matcher, "--vo", "lhcb",
         "--workdir", str(tmp / "lone"), "--token-file", str(token_file),
         "--idle-timeout", "3", "--backoff-cap", "0.5", "--report-timeout", "1", *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp)


AT_THE_DEMO_SITE = ("--site", "DIRAC.Demo.local", "--ce", "localhost", "--queue", "local")


def test_a_pilot_with_a_token_the_matcher_does_not_accept_exits_3(grid: Grid) -> None:
    forged = issue_token("another-secret-0123456789abcdef", subject="pilots", role="pilot",
                         vo="lhcb", group="lhcb_pilot", lifetime=3600)
    for where in ((), AT_THE_DEMO_SITE):
        ran = _lone_pilot(grid.base, forged, grid.tmp, *where)
        assert ran.returncode == 3, ran.stderr
        last = ran.stderr.strip().splitlines()[-1]
        assert last.startswith("gridpilot-pilot: exit 3: the matcher refused") and "401" in last


def test_a_pilot_at_a_site_its_token_is_not_for_exits_3(grid: Grid) -> None:
    ran = _lone_pilot(grid.base, grid.pilot_token, grid.tmp, "--site", "LCG.CERN.cern",
                      "--ce", "ce503.cern.ch", "--queue", "condor")
    assert ran.returncode == 3, ran.stderr
    last = ran.stderr.strip().splitlines()[-1]
    assert "403" in last and "DIRAC.Demo.local" in last, last


def test_a_pilot_given_a_wrong_matcher_url_exits_3(grid: Grid) -> None:
    ran = _lone_pilot(grid.base + "/not-the-matcher", grid.pilot_token, grid.tmp,
                      *AT_THE_DEMO_SITE)
    assert ran.returncode == 3, ran.stderr
    assert "404" in ran.stderr.strip().splitlines()[-1]


def test_a_pilot_that_never_reaches_the_matcher_exits_5(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    for where in ((), AT_THE_DEMO_SITE):
        ran = _lone_pilot(nowhere, "a.b.c", tmp_path, *where)
        assert ran.returncode == 5, ran.stderr
        last = ran.stderr.strip().splitlines()[-1]
        assert last.startswith(f"gridpilot-pilot: exit 5: the matcher at {nowhere} was never "
                               "reached"), last
        assert "ConnectionError" in last


# -- item 12: what the site and the payload give the pilot ------------------------------------


def test_absurd_job_features_are_unknown_and_the_pilot_still_matches(grid: Grid) -> None:
    job_features = grid.tmp / "jobfeatures"
    write_features(job_features, {
        "shutdowntime_job": b"99999999999999999999999999999\n", "allocated_CPU": 1})
    job_id = submit(grid, "/bin/echo", "fine")
    proc = grid.pilot("--idle-timeout", "2", features=(None, job_features))
    code, out = finish(proc)
    assert code == 0, out
    assert grid.job(job_id)["status"] == "Done", out
    assert "shutdowntime_job" in out and "absurdly large" in out


def test_finished_job_folders_are_removed_once_the_report_is_built(grid: Grid) -> None:
    first = submit(grid, "/bin/echo", "first")
    code, out = finish(grid.pilot("--cores", "1", "--idle-timeout", "2"))
    assert code == 0, out
    assert grid.job(first)["status"] == "Done", out
    assert not (grid.tmp / "work" / f"job_{first}").exists()
    output = requests.get(f"{grid.base}/api/v1/jobs/{first}/output",
                          headers=grid.user.headers, timeout=30).json()
    assert "first" in output["output_tail"]
    kept = submit(grid, "/bin/echo", "kept")
    code, out = finish(grid.pilot("--cores", "1", "--idle-timeout", "2", "--keep-job-folders"))
    assert code == 0, out
    assert "kept" in (grid.tmp / "work" / f"job_{kept}" / "output.log").read_text()


# -- item 14: undelivered reports can be replayed ---------------------------------------------


def test_undelivered_reports_are_replayed_with_replay(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    port = free_port()
    resources = ROOT / "conf" / "resources.toml"
    with matcher_server(url, SECRET, resources, tmp_path, port=port) as base:
        grid = Grid(base, tmp_path)
        job_id = submit(grid, "/bin/sh", "-c 'sleep 3; echo replayed'")
        proc = grid.pilot("--cores", "1", "--idle-timeout", "1", "--report-timeout", "1")
        grid.wait_status(job_id, {"Running"})
    # The matcher is down when the payload ends: the pilot keeps the report and exits 4.
    code, out = finish(proc)
    assert code == 4, out
    kept = tmp_path / "work" / "undelivered-reports.json"
    assert "undelivered-reports.json" in out.strip().splitlines()[-1]

    def replay() -> subprocess.CompletedProcess[str]:
        token_file = write_token_file(tmp_path / "replay.token", grid.pilot_token)
        return subprocess.run(
            [sys.executable, "-m", "pilot.cli", "--matcher", base, "--replay", str(kept),
             "--token-file", str(token_file), "--report-timeout", "1", "--backoff-cap", "0.2"],
            capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)

    still_down = replay()
    assert still_down.returncode == 4, still_down.stderr
    assert kept.exists()
    with matcher_server(url, SECRET, resources, tmp_path, port=port):
        ran = replay()
        assert ran.returncode == 0, ran.stderr
        assert "1 reports delivered" in ran.stdout
        job = grid.job(job_id)
    assert job["status"] == "Done" and job["exit_code"] == 0, job
    assert not kept.exists()


def test_replay_refuses_a_file_that_is_not_reports(grid: Grid, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('[{"job_id": "seven", "status": "Done"}]')
    token_file = write_token_file(tmp_path / "replay.token", grid.pilot_token)
    ran = subprocess.run(
        [sys.executable, "-m", "pilot.cli", "--matcher", grid.base, "--replay", str(bad),
         "--token-file", str(token_file)],
        capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 2
    assert "report 1: job_id must be a positive integer" in ran.stderr


# -- issue 33 item 10: what a user reads of a shared pilot's log ------------------------------


def test_a_real_pilot_marks_what_it_logs_of_each_job(grid: Grid) -> None:
    first = submit(grid, "/bin/echo", "first")
    second = submit(grid, "/bin/sleep", "0.2")
    code, out = finish(grid.pilot("--cores", "2", "--idle-timeout", "2"))
    assert code == 0, out
    assert f"[job {second}]: job {second} started on 1 core(s): /bin/sleep" in out, out
    part = part_for_owner(out, {first})
    assert f"[job {first}]: job {first} started on 1 core(s): /bin/echo" in part.text
    assert f"[job {first}]: job {first} ended with exit code 0" in part.text
    assert "/bin/sleep" not in part.text and f"job {second}" not in part.text
    assert "pilot finished" in part.text and part.hidden_lines >= 2
