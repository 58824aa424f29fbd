"""tools/topology refuses what it cannot do with a sentence, never a traceback: nothing up,
a service it does not know, a server that is not PostgreSQL, a folder the daemons cannot
reach; `down` of nothing is fine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "topology"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          timeout=120)


def _refused(done: subprocess.CompletedProcess[str], message: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("tools/topology: ") and message in done.stderr, done.stderr


def test_nothing_up(tmp_path: Path) -> None:
    for command in ("status", "env"):
        _refused(_run(command, "--dir", str(tmp_path)), "nothing is up in")
    _refused(_run("restart", "matcher-1", "--dir", str(tmp_path)), "nothing is up in")
    assert _run("down", "--dir", str(tmp_path)).returncode == 0


def test_a_service_it_does_not_know(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"matchers": 2, "pids": {},
                                                      "ports": {}}))
    _refused(_run("start", "postgres", "--dir", str(tmp_path)),
             "no service 'postgres'; the services are pgbouncer, matcher-1, matcher-2")
    _refused(_run("kill", "--dir", str(tmp_path)), "kill needs the name of a service")


def test_a_server_that_is_not_postgresql(tmp_path: Path) -> None:
    _refused(_run("up", "--dir", str(tmp_path / "t"), "--postgres",
                  "mysql+pymysql://root@127.0.0.1:3306/test"), "is not a PostgreSQL URL")
    _refused(_run("up", "--dir", str(tmp_path / "t"), "--matchers", "0"),
             "--matchers must be between 1 and 16")


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemons run as nobody only under root")
def test_a_folder_the_daemons_cannot_reach(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    _refused(_run("up", "--dir", str(closed / "topology")),
             "is not reachable by the user nobody")


def test_a_resources_file_or_setting_it_cannot_use(tmp_path: Path) -> None:
    _refused(_run("up", "--dir", str(tmp_path / "t"), "--resources",
                  str(tmp_path / "missing.toml")), "missing.toml: no such file")
    for bad in ("pilot_idle_timeout=5", "agents.=5", "agents.idle", "1x.key=2"):
        _refused(_run("up", "--dir", str(tmp_path / "t"), "--set", bad),
                 f"--set {bad!r} is not SECTION.KEY=VALUE")
    assert not (tmp_path / "t" / "state.json").exists()


def test_env_names_what_the_client_reads(tmp_path: Path) -> None:
    state = {"url": "https://localhost:4443", "ca": str(tmp_path / "tls" / "ca.crt"),
             "tokens": {"user": str(tmp_path / "tokens" / "user.token"),
                        "operator": str(tmp_path / "tokens" / "operator token")}}
    (tmp_path / "state.json").write_text(json.dumps(state))
    done = _run("env", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for line in (f"export GRIDPILOT_URL={state['url']}",
                 f"export GRIDPILOT_CA_BUNDLE={state['ca']}",
                 f"export GRIDPILOT_TOKEN_FILE={tmp_path}/tokens/user.token",
                 f"export GRIDPILOT_OPERATOR_TOKEN_FILE='{tmp_path}/tokens/operator token'",
                 f"export GRIDPILOT_TOPOLOGY_URL={state['url']}",
                 f"export GRIDPILOT_TOPOLOGY_CA={state['ca']}",
                 f"export GRIDPILOT_TOPOLOGY_STATE={tmp_path}/state.json"):
        assert line in lines, done.stdout
    # A topology brought up before the tokens existed: the rest still.
    del state["tokens"]
    (tmp_path / "state.json").write_text(json.dumps(state))
    done = _run("env", "--dir", str(tmp_path))
    assert done.returncode == 0 and "GRIDPILOT_TOKEN_FILE" not in done.stdout, done.stderr
    assert f"export GRIDPILOT_URL={state['url']}" in done.stdout.splitlines()
