"""A real pilot against a real matcher on loopback, attacked by its own payloads and by a
careless site: what payloads can read, what they leave behind, how the pilot ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gridpilot import schema
from gridpilot.devserver import matcher_server
from taskqueue.database import make_engine
from tests.helpers import write_token_file
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


def test_a_payload_finds_the_pilot_token_nowhere(grid: Grid) -> None:
    script = grid.tmp / "snoop.py"
    script.write_text(SNOOP, encoding="utf-8")
    result = grid.tmp / "seen.json"
    token_file = grid.tmp / "pilot.token"
    job_id = submit(grid, sys.executable, f"{script} {result} {token_file}")
    proc = grid.pilot("--cores", "1", "--idle-timeout", "2")
    code, out = finish(proc)
    assert code == 0, out
    assert grid.job(job_id)["status"] == "Done", out
    seen = json.loads(result.read_text())
    # The payload did look at the pilot (its parent) and beyond.
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
        proc = subprocess.Popen(
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
