"""A pilot-only install (``pip install 'gridpilot[pilot]'``) in a fresh virtual environment:
no database, web or ClassAd library; working gridpilot-pilot, gridpilot-drain-cost and
gridpilot-client against a real matcher; and a ``gridpilot`` that names the missing extra.

About 40 s: most of it is pip building and installing the package."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from gridpilot import schema
from gridpilot.devserver import matcher_server
from taskqueue.db.database import make_engine
from taskqueue.tokens import issue_token
from tests.helpers import write_token_file

ROOT = Path(__file__).resolve().parents[2]
SECRET = "pilot-install-secret-0123456789abcdef"
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "taskqueue", "optimizers", "matcher",
           "agents", "pilot", "client", "gridpilot", "migrations", "psij-descriptors", "conf")


@pytest.fixture(scope="module")
def pilot_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with the 'pilot' extra installed from a copy of the sources (the build
    leaves nothing in the working tree)."""
    base = tmp_path_factory.mktemp("pilot-install")
    source = base / "src"
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, source / name)
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True)
    pip = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          f"{source}[pilot]"], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    yield env_dir / "bin"


def run(command: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})


def test_only_the_pilots_dependencies_are_installed(pilot_venv: Path) -> None:
    for module in ("sqlalchemy", "flask", "alembic", "classad2", "psij", "jwt", "psycopg"):
        probe = run([str(pilot_venv / "python"), "-c", f"import {module}"])
        assert probe.returncode != 0, f"{module} is installed in a pilot-only venv"
    assert run([str(pilot_venv / "python"), "-c", "import requests, click"]).returncode == 0


def test_gridpilot_names_the_missing_extra(pilot_venv: Path) -> None:
    out = run([str(pilot_venv / "gridpilot"), "--help"])
    assert out.returncode == 2
    assert "'server' extra" in out.stderr and "pip install 'gridpilot[server]'" in out.stderr
    assert "gridpilot-client" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_pilot_side_commands_work(pilot_venv: Path, tmp_path: Path) -> None:
    for command in ("gridpilot-pilot", "gridpilot-drain-cost", "gridpilot-client"):
        out = run([str(pilot_venv / command), "--help"])
        assert out.returncode == 0, out.stderr
    (tmp_path / "jobstatus").mkdir()
    cost = run([str(pilot_venv / "gridpilot-drain-cost"), "--root", str(tmp_path / "jobstatus"),
                "--json"])
    # it runs (standard library only) and says why there is nothing to rank
    assert cost.returncode == 1 and "no pilot $JOBSTATUS directory" in cost.stderr, cost.stderr
    url = f"sqlite:///{tmp_path / 'g.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    user = issue_token(SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user",
                       lifetime=600)
    pilot = issue_token(SECRET, subject="factory", role="pilot", vo="lhcb",
                        group="lhcb_pilot", lifetime=600)
    (tmp_path / "job.jdl").write_text('Executable = "/bin/echo"; Arguments = "from the venv";')
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", tmp_path,
                        workers=1) as base:
        client = [str(pilot_venv / "gridpilot-client"), "--url", base, "--token", user]
        submitted = run([*client, "submit", str(tmp_path / "job.jdl")])
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.split()[0]
        write_token_file(tmp_path / "token", pilot)
        ran = run([str(pilot_venv / "gridpilot-pilot"), "--matcher", base, "--token-file",
                   str(tmp_path / "token"), "--vo", "lhcb", "--site", "LCG.CERN.cern",
                   "--ce", "ce503.cern.ch", "--queue", "condor", "--cores", "1",
                   "--submit-pools", "", "--idle-timeout", "1",
                   "--workdir", str(tmp_path / "pilot")], timeout=120)
        assert ran.returncode == 0, ran.stderr
        waited = run([*client, "wait", job_id, "--timeout", "30", "--interval", "0.5"])
        assert waited.returncode == 0, waited.stdout + waited.stderr
        output = run([*client, "output", job_id, "-d", str(tmp_path / "out")])
        assert output.returncode == 0, output.stderr
    assert "from the venv" in (tmp_path / "out" / "output.txt").read_text()
    assert sys.executable not in str(pilot_venv)
