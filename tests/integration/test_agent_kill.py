"""A real agent process killed with SIGKILL while one of its loops runs: its turn stays held
while the process lives (the heartbeat renews it past the lease), and is free for another
process once the lease has passed after the kill, instead of for an hour."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from taskqueue.agentruns import start_run
from taskqueue.db.database import run_in_transaction
from taskqueue.db.models import AgentRun
from tests.conftest import Database

ROOT = Path(__file__).resolve().parents[2]
LEASE = 3  # seconds: the smallest the settings accept
#: An agent process whose watchdog loop takes its turn, then works for an hour.
AGENT = """
import sys, time
from pathlib import Path
from agents.context import AgentContext
from agents.runner import Agents, Loop
from taskqueue.db.database import engine_for, make_session_factory
from taskqueue.core.settings import load_settings
import os

settings = load_settings(None, os.environ)
agents = Agents(AgentContext(settings, make_session_factory(engine_for(settings.database))),
                ["watchdog"])

def busy() -> str:
    Path(sys.argv[1]).write_text(agents.holder)
    time.sleep(3600)
    return "done"

agents.loops = [Loop("watchdog", 60, busy)]
agents.run_forever()
"""


def _take(db: Database, holder: str) -> bool:
    return run_in_transaction(db.factory, partial(
        start_run, name="watchdog", holder=holder, now=datetime.now(UTC), interval=60,
        lease=LEASE, force=True))


def _wait_for(path: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, "the agent process exited"
        assert time.monotonic() < deadline, "the agent process never started its loop"
        time.sleep(0.1)


def test_a_killed_agents_turn_is_free_after_the_lease(db: Database, tmp_path: Path) -> None:
    started = tmp_path / "started"
    env = {**os.environ, "GRIDPILOT_DATABASE_URL": db.url,
           "GRIDPILOT_RESOURCES_FILE": str(ROOT / "conf" / "resources.toml"),
           "GRIDPILOT_AGENTS_TURN_LEASE": str(LEASE),
           "GRIDPILOT_AGENTS_PILOT_WORKDIR": str(tmp_path / "pilots")}
    proc = subprocess.Popen([sys.executable, "-c", AGENT, str(started)], env=env, cwd=ROOT)
    try:
        _wait_for(started, proc)
        holder = started.read_text()
        # Well past the lease since the turn was taken, the living agent still holds it.
        time.sleep(3 * LEASE)
        assert not _take(db, "other:1")
        with db.factory() as s:
            run = s.get(AgentRun, "watchdog")
            assert run is not None
            assert (run.holder, run.finished_at) == (holder, None)
            assert run.renewed_at is not None and run.renewed_at > run.started_at
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    # The dead agent's turn comes free (with the old one-hour lease it never did here).
    deadline = time.monotonic() + 60
    while not _take(db, "other:1"):
        assert time.monotonic() < deadline, "the killed agent's turn was never freed"
        time.sleep(0.5)
