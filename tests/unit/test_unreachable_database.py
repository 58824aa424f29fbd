"""A database server that refuses connections (stopped, or PgBouncer restarting): a pilot's
match is a 503 with Retry-After, never a 500, on either server's claim path; the agents wait
for the database instead of exiting."""

from __future__ import annotations

import signal
import socket
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agents.context import AgentContext
from agents.runner import Agents
from matcher.app import create_app
from matcher.auth import issue_token
from matcher.runtime import runtime_of
from taskqueue.core.errors import DatabaseUnavailableError
from taskqueue.core.resources import parse_resource
from taskqueue.core.settings import DatabaseSettings, Settings
from taskqueue.db.database import engine_for, make_session_factory
from taskqueue.pilots.pilotmatch import match_for_pilot, open_match_database

SECRET = "unreachable-database-secret-0123456789"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port  # nothing listens there once the socket is closed


@pytest.fixture(params=["postgresql+psycopg://postgres", "mysql+pymysql://root"])
def gone(request: pytest.FixtureRequest) -> DatabaseSettings:
    return DatabaseSettings(url=f"{request.param}@127.0.0.1:{_closed_port()}/gone",
                            connect_timeout=1)


def test_a_match_finds_the_database_unavailable(gone: DatabaseSettings) -> None:
    sessions = make_session_factory(engine_for(gone))
    db = open_match_database(gone, sessions)
    resource = parse_resource({"vo": "lhcb", "pilot_reference": "p-1"})
    with pytest.raises(DatabaseUnavailableError, match="try again"):
        match_for_pilot(db, resource, now=datetime.now(UTC))


def test_the_match_endpoint_says_when_to_come_back(gone: DatabaseSettings,
                                                   tmp_path: Path) -> None:
    settings = Settings(database=gone)
    settings = replace(settings, auth=replace(settings.auth, secret=SECRET),
                       matcher=replace(settings.matcher, metrics_dir=str(tmp_path / "m")))
    app = create_app(settings)
    token = issue_token(SECRET, subject="p", role="pilot", vo="lhcb", group="lhcb_pilot",
                        lifetime=600)
    try:
        for count in (1, 1, 3):  # the claim function's path, again, and a group's size
            answer = app.test_client().post(
                "/api/v1/pilots/match", headers={"Authorization": f"Bearer {token}"},
                json={"resource": {"vo": "lhcb", "pilot_reference": "p-1"}, "count": count})
            assert answer.status_code == 503, answer.get_data(as_text=True)
            assert answer.headers["Retry-After"] == "5"
            assert answer.mimetype == "application/problem+json"
    finally:
        runtime_of(app).dispose()


def test_the_agents_wait_for_the_database(gone: DatabaseSettings) -> None:
    settings = Settings(database=gone)
    runner = Agents(AgentContext(settings, make_session_factory(engine_for(gone))),
                    ["watchdog", "cleanup"])
    summaries = runner.run_once()
    assert set(summaries) == {"watchdog", "cleanup"}
    assert all(summary.startswith("not run: the database did not answer")
               for summary in summaries.values())
    rounds: list[float] = []

    def sleep(seconds: float) -> None:
        rounds.append(seconds)
        runner.stopping = len(rounds) >= 3

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        runner.run_forever(sleep=sleep)  # three rounds, and no exception
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert rounds == [2.0, 4.0, 8.0]  # backing off while the database is away
