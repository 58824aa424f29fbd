"""A PostgreSQL server of the test's own is restarted under a running matcher and under the
agents: the agents log, wait and carry on (they never exit for it), and the matcher's first
requests after the restart are answered, not refused for a connection the restart killed."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import requests

from agents.context import AgentContext
from agents.runner import Agents
from gridpilot import schema
from gridpilot.devserver import matcher_server
from matcher.auth import issue_token
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine, make_session_factory
from tests.integration.test_hung_database import (
    ROOT,
    SECRET,
    _as_server_user,
    private_postgres,
)

__all__ = ["private_postgres"]  # the fixture, used by name


def _pg_ctl(data: Path, *args: str) -> None:
    # No pipes: the server it starts would hold them open.
    subprocess.run(_as_server_user(["pg_ctl", "-D", str(data), "-w", *args]), check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def _start(url: str, data: Path) -> None:
    """Start the server again with the options the fixture started it with."""
    port, home = url.rsplit(":", 1)[1].split("/")[0], data.parent
    _pg_ctl(data, "-l", str(home / "log"), "-o",
            f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off", "start")


def _restart(data: Path) -> None:
    _pg_ctl(data, "-l", str(data.parent / "log"), "-m", "immediate", "restart")


def test_the_agents_outlive_a_database_restart(private_postgres: tuple[str, Path]) -> None:
    url, data = private_postgres
    engine = make_engine(url)
    schema.upgrade(engine)
    runner = Agents(AgentContext(Settings(), make_session_factory(engine)),
                    ["watchdog", "cleanup"])
    assert not any(s.startswith("not run") for s in runner.run_once().values())
    # Down: every turn is "not run", and the process goes on.
    _pg_ctl(data, "-m", "immediate", "stop")
    summaries: list[dict[str, str]] = []
    try:
        summaries.append(runner.run_once())
        summaries.append(runner.run_once())
    finally:
        _start(url, data)
    assert all(s.startswith("not run: ") for r in summaries for s in r.values()), summaries
    # Back: the pooled connections the restart killed do not cost a turn.
    after = runner.run_once()
    assert not any(s.startswith("not run") for s in after.values()), after
    # And the same through run_forever, across a restart in the middle of it.
    rounds: list[int] = []

    def sleep(_seconds: float) -> None:
        rounds.append(1)
        if len(rounds) == 1:
            _restart(data)
        runner.stopping = len(rounds) >= 3

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        runner.run_forever(sleep=sleep)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert len(rounds) == 3
    engine.dispose()


def test_the_first_requests_after_a_restart_are_answered(private_postgres: tuple[str, Path],
                                                         tmp_path: Path) -> None:
    url, data = private_postgres
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    token = issue_token(SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user",
                        lifetime=600)
    work = tmp_path / "work"
    work.mkdir()
    headers = {"Authorization": f"Bearer {token}"}
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", work,
                        workers=1) as base:
        for _ in range(4):  # every pooled connection in use once
            assert requests.get(f"{base}/api/v1/jobs", headers=headers,
                                timeout=30).status_code == 200
        _restart(data)
        statuses = [requests.get(f"{base}/api/v1/jobs", headers=headers, timeout=30)
                    for _ in range(6)]
        assert [r.status_code for r in statuses] == [200] * 6, [r.text for r in statuses]
