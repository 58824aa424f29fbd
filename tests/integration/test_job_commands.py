"""The job commands of the real ``gridpilot`` CLI, on an SQLite database, against the shipped
resources configuration."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def gp(tmp_path: Path):  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDPILOT_")}
    env["GRIDPILOT_DATABASE_URL"] = f"sqlite:///{tmp_path / 'g.db'}"
    env["GRIDPILOT_RESOURCES_FILE"] = str(ROOT / "conf" / "resources.toml")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gridpilot", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)

    assert run("db", "upgrade").returncode == 0
    return run


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_submit_list_show_and_explain(gp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gpu = _write(tmp_path, "gpu.jdl", '[Executable = "train.py"; Tags = {"GPU"}; '
                                      'CPUTime = 3600]')
    plain = _write(tmp_path, "plain.jdl", 'Executable = "sim.sh"; Parameters = 2;')
    out = gp("submit", gpu, plain, "--owner", "alice")
    assert out.returncode == 0, out.stderr
    ids = [int(x) for x in out.stdout.split()]
    assert len(ids) == 3

    listing = gp("jobs", "--status", "Waiting", "--owner", "alice")
    assert listing.returncode == 0
    assert listing.stdout.count(" Waiting ") == 3 and "3 job(s)" in listing.stdout

    shown = gp("job", str(ids[0]))
    assert "Executable = \"train.py\"" in shown.stdout
    assert re.search(r"Received\s+submit", shown.stdout)
    assert re.search(r"Waiting\s+optimizer\s+Pilot Agent Submission", shown.stdout)

    good = gp("explain", str(ids[0]), "--queue", "LCG.RAL.uk/arc-ce01.gridpp.rl.ac.uk/gpu")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "=> it can run there" in good.stdout
    bad = gp("explain", str(ids[0]), "--queue", "LCG.CERN.cern/ce503.cern.ch/condor")
    assert bad.returncode == 3
    assert "[NO] tags: job needs tags GPU; resource has none (missing GPU)" in bad.stdout
    assert "=> it cannot run there" in bad.stdout

    resource = _write(tmp_path, "node.json", json.dumps(
        {"vo": "lhcb", "site": "LCG.RAL.uk", "tags": ["GPU"], "processors": 4}))
    assert gp("explain", str(ids[0]), "--resource", resource).returncode == 0

    everywhere = gp("explain", str(ids[0]))
    assert everywhere.returncode == 0, everywhere.stdout + everywhere.stderr
    lines = everywhere.stdout.splitlines()
    assert lines[0] == f"job {ids[0]} (Waiting) against every configured queue:"
    assert "[ok] LCG.RAL.uk/arc-ce01.gridpp.rl.ac.uk/gpu" in lines
    assert ("[NO] LCG.CERN.cern/ce503.cern.ch/condor: tags: job needs tags GPU; resource has "
            "none (missing GPU)") in lines
    assert re.fullmatch(r"=> 1 of \d+ configured queues can run it", lines[-1])


def test_bad_input_is_refused_whole_with_the_place(gp, tmp_path: Path  # type: ignore[no-untyped-def]
                                                   ) -> None:
    good = _write(tmp_path, "good.jdl", '[Executable = "x"]')
    bad = _write(tmp_path, "bad.jdl", '[Executable = "x"; Priority = "high"]')
    out = gp("submit", good, bad)
    assert out.returncode == 1
    assert f"{bad}: Priority must be an integer from 0 to 10, got \"high\"" in out.stderr
    assert "Traceback" not in out.stderr
    assert "0 job(s)" in gp("jobs").stdout  # the good file was not stored either
    assert gp("explain", "999", "--queue", "a/b/c").returncode == 1
    unknown_queue = gp("explain", "1", "--queue", "nope")
    assert unknown_queue.returncode == 1 and "Traceback" not in unknown_queue.stderr


def test_json_submission_and_requirements_failure(gp, tmp_path: Path  # type: ignore[no-untyped-def]
                                                  ) -> None:
    spec = _write(tmp_path, "job.json", json.dumps({
        "executable": "/bin/true",
        "attributes": {"custom_attributes": {"Requirements": {"SoftwareTag": "VO-lhcb-none"}}},
    }))
    out = gp("submit", "--json", spec)
    assert out.returncode == 0
    (job_id,) = [int(x) for x in out.stdout.split()]
    assert "failed: Requirements: no queue offers SoftwareTag 'VO-lhcb-none'" in out.stderr
    assert "Failed" in gp("job", str(job_id)).stdout
    assert gp("optimize").stdout.strip() == "0 job(s) now Waiting, 0 failed"
