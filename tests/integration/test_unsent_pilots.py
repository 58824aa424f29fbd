"""Pilots whose submission never reached their CE (issue 34 item 6), on every backend: an
ARC-CE whose REST interface is down (nothing listens on its port) refuses the connection; the
director leaves no pilot record of them (they would count with the pilots that ran and
failed), and the queue counts them, keeps the reason, and backs off; ``gridpilot director
status`` and the agents' metrics say how many never reached the CE."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import jwt

from agents.context import AgentContext
from agents.director import Director
from agents.metrics import AgentMetrics
from taskqueue.core.settings import Settings
from tests.conftest import Database
from tests.integration.test_cli import run
from tests.integration.test_director import (
    SECRET,
    agent_settings,
    director_queue,
    echo_jobs,
    pilots,
    submit_jobs,
    write_resources,
)

SITE, CE, QUEUE = "Test.Down.org", "arc.down.org", "grid"
NAME = f"{SITE}/{CE}/{QUEUE}"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_submissions_that_never_reach_a_down_ce_leave_no_pilot_record(
        db: Database, settings: Settings, tmp_path: Path) -> None:
    endpoint = f"https://127.0.0.1:{closed_port()}/arex"
    token = tmp_path / "ce.token"
    claims = {"sub": "director", "aud": endpoint, "exp": int(time.time()) + 3600}
    token.write_text(jwt.encode(claims, "a key the CE would check, never reached"),
                     encoding="ascii")
    token.chmod(0o600)
    resources = write_resources(tmp_path, f"""\
[Sites."{SITE}"]
VO = "lhcb"
HS06 = 10.0
MaxCPUTime = 60

[Sites."{SITE}".CEs."{CE}"]
Executor = "arc"
Endpoint = "{endpoint}"
TokenFile = "{token}"

[Sites."{SITE}".CEs."{CE}".Queues.{QUEUE}]
NumberOfProcessors = 1
""")
    ctx = AgentContext(agent_settings(settings, tmp_path, resources, failure_backoff=600),
                       db.factory, secret=SECRET)
    submit_jobs(ctx, echo_jobs(SITE, 3))
    report = Director(ctx).cycle()
    assert report.submitted == {NAME: 0}, report.line()
    assert "failure 1 in a row" in report.failed[NAME], report.line()
    assert pilots(db) == []
    state = director_queue(db, SITE, CE, QUEUE)
    assert state.unsent_pilots == 3 and state.failures == 1
    assert "refused" in state.last_error.lower(), state.last_error

    status = run(["director", "status"], tmp_path, GRIDPILOT_DATABASE_URL=db.url)
    assert status.returncode == 0, status.stderr
    assert f"{NAME}: 1 failed submission(s) in a row" in status.stdout, status.stdout
    assert "(3 pilot(s) never reached its CE)" in status.stdout, status.stdout

    metrics = AgentMetrics(ctx, {}).render().decode()
    assert (f'gridpilot_director_unsent_pilots_total{{ce="{CE}",queue="{QUEUE}",'
            f'site="{SITE}"}} 3.0') in metrics, metrics
