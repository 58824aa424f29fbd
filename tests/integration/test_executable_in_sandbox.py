"""A DIRAC JDL as users write it, ``Executable = "run.sh"`` with run.sh in the InputSandbox
and no mode bits kept, submitted with ``gridpilot-client`` to a real matcher on loopback and
run by a real pilot subprocess: the pilot starts the file of the job's folder, as DIRAC's job
wrapper does."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from client.cli import cli
from matcher.auth import issue_token
from tests.integration import test_sandboxes_pilot
from tests.integration.test_sandboxes_pilot import SECRET, User, finish, run_pilot

#: A matcher on loopback with a local sandbox store, on the test database.
server = test_sandboxes_pilot.server

SCRIPT = '#!/bin/sh\necho "run.sh ran in $(basename "$PWD") with $1"\n'


def _client(base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Result:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    token = issue_token(SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user",
                        lifetime=3600)
    return CliRunner().invoke(cli, ["--url", base, "--token", token, *args],
                              catch_exceptions=False)


def test_a_shipped_script_without_its_mode_runs_by_its_bare_name(
        server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "submit"
    folder.mkdir()
    (folder / "run.sh").write_text(SCRIPT)
    (folder / "run.sh").chmod(0o644)
    (folder / "job.jdl").write_text('[ Executable = "run.sh"; Arguments = "grid"; '
                                    'InputSandbox = {"run.sh"}; ]')
    result = _client(server, tmp_path, monkeypatch, "submit", str(folder / "job.jdl"))
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    job_id = int(result.stdout.strip())
    out = finish(run_pilot(server, tmp_path))
    alice = User(server)
    job = alice.get(f"/jobs/{job_id}")
    assert job["status"] == "Done", out
    output = alice.get(f"/jobs/{job_id}/output")
    assert output["exit_code"] == 0
    assert f"run.sh ran in job_{job_id} with grid" in output["output_tail"]


def test_the_client_warns_of_a_script_its_files_do_not_hold(
        server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "submit"
    (folder / "tools").mkdir(parents=True)
    (folder / "tools" / "go.sh").write_text(SCRIPT)
    (folder / "job.jdl").write_text('[ Executable = "tools/go.sh"; '
                                    'InputSandbox = {"tools/go.sh"}; ]')
    result = _client(server, tmp_path, monkeypatch, "submit", str(folder / "job.jdl"))
    assert result.exit_code == 0, result.output  # accepted all the same
    assert 'job.jdl: warning: Executable "tools/go.sh" is not among' in result.stderr
    assert '"go.sh" is unpacked at the top' in result.stderr
    assert result.stdout.strip().isdigit()
