"""The agents' metrics: what the database says of the loops, the pilots that ended lately and
the site director's failures, this process's own runs, served at [agents] metrics_bind to the
scrapers the matcher admits; a database that does not answer is said, not hidden."""

from __future__ import annotations

import secrets
import signal
import socket
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial

import pytest
import requests

from agents.context import AgentContext
from agents.metrics import AgentMetrics, MetricsServer
from agents.runner import Agents
from taskqueue.agentruns import finish_run, start_run
from taskqueue.core.errors import ConfigurationError
from taskqueue.core.settings import DatabaseSettings, Settings
from taskqueue.db.database import Session, run_in_transaction
from taskqueue.db.models import DirectorQueue, Pilot
from tests.api.test_service import samples, value
from tests.conftest import Database

TOKEN = secrets.token_urlsafe(32)
S = timedelta(seconds=1)


def _settings(settings: Settings, **agents: object) -> Settings:
    return replace(settings, matcher=replace(settings.matcher, metrics_token=TOKEN,
                                             metrics_allow=("192.0.2.0/24",)),
                   agents=replace(settings.agents, **agents))


def _pilot(vo: str, site: str, status: str, at: datetime | None, n: int) -> Pilot:
    return Pilot(reference=f"{site}-{status}-{n}-{at}", vo=vo, site=site, ce="ce1",
                 queue="q", status=status, submitted_at=at or datetime.now().astimezone(),
                 updated_at=at)


def _fill(db: Database, now: datetime) -> None:
    def work(session: Session) -> None:
        recent, old = now - 10 * 60 * S, now - 2 * 3600 * S
        session.add_all([_pilot("lhcb", "LCG.CERN.cern", "Failed", recent, i) for i in range(3)])
        session.add_all([_pilot("lhcb", "LCG.CERN.cern", "Done", recent, i) for i in range(2)])
        session.add_all([_pilot("lhcb", "LCG.CERN.cern", "Failed", old, i) for i in range(5)])
        session.add_all([_pilot("lhcb", "LCG.CERN.cern", "Running", recent, i)
                         for i in range(4)])
        session.add(_pilot("belle", "LCG.CERN.cern", "Lost", recent, 0))
        for i, at in enumerate((recent, recent, old)):  # killed for hanging in ACCEPTING
            hung = _pilot("lhcb", "LCG.RAL.uk", "Aborted", at, i)
            hung.ce, hung.queue, hung.hung_in = "arc-ce01", "grid", "ACCEPTING"
            session.add(hung)
        session.add(DirectorQueue(site="LCG.RAL.uk", ce="arc-ce01", queue="grid", failures=4,
                                  poll_failures=2,
                                  last_error="refused"))
    run_in_transaction(db.factory, work)
    for name, summary, at in (("watchdog", "3 job(s) stalled", now - 30 * S),
                              ("director", "failed: OSError: no batch system", now - 90 * S)):
        run_in_transaction(db.factory, partial(start_run, name=name, holder="a:1", now=at,
                                               interval=60, lease=90, force=True))
        run_in_transaction(db.factory, partial(finish_run, name=name, holder="a:1",
                                               now=at + 5 * S, summary=summary))
    run_in_transaction(db.factory, partial(start_run, name="cleanup", holder="a:1",
                                           now=now - 20 * S, interval=300, lease=90))


def test_what_the_database_says(db: Database, settings: Settings, now: datetime) -> None:
    _fill(db, now)
    ctx = AgentContext(_settings(settings), db.factory, clock=lambda: now)
    metrics = AgentMetrics(ctx, {"watchdog": 60, "director": 60})
    try:
        metrics.record("watchdog", failed=False, seconds=0.25)
        metrics.record("watchdog", failed=False, seconds=0.5)
        metrics.record("director", failed=True, seconds=2.0)
        rows = samples(metrics.render().decode())
    finally:
        metrics.dispose()
    assert value(rows, "gridpilot_database_up") == 1
    assert value(rows, "gridpilot_pilots_ended", vo="lhcb", site="LCG.CERN.cern",
                 status="Failed") == 3  # the five that ended two hours ago are not counted
    assert value(rows, "gridpilot_pilots_ended", vo="lhcb", status="Done") == 2
    assert value(rows, "gridpilot_pilots_ended", vo="belle", status="Lost") == 1
    assert not [r for r in rows if r[0] == "gridpilot_pilots_ended"
                and r[1]["status"] == "Running"]
    assert value(rows, "gridpilot_director_queue_failures", site="LCG.RAL.uk",
                 queue="grid") == 4
    assert value(rows, "gridpilot_director_queue_poll_failures", site="LCG.RAL.uk",
                 queue="grid") == 2
    assert value(rows, "gridpilot_director_pilots_stuck", site="LCG.RAL.uk", ce="arc-ce01",
                 queue="grid", state="ACCEPTING") == 2  # not the one killed two hours ago
    assert value(rows, "gridpilot_agent_loop_last_run_failed", loop="director") == 1
    assert value(rows, "gridpilot_agent_loop_last_run_failed", loop="watchdog") == 0
    assert value(rows, "gridpilot_agent_loop_last_run_failed", loop="cleanup") == 0  # runs
    assert value(rows, "gridpilot_agent_loop_last_seen_timestamp_seconds",
                 loop="watchdog") == pytest.approx((now - 25 * S).timestamp())
    assert value(rows, "gridpilot_agent_loop_last_start_timestamp_seconds",
                 loop="cleanup") == pytest.approx((now - 20 * S).timestamp())
    assert value(rows, "gridpilot_agent_loop_interval_seconds", loop="director") == 60
    assert value(rows, "gridpilot_agent_loop_runs_total", loop="watchdog", outcome="ok") == 2
    assert value(rows, "gridpilot_agent_loop_runs_total", loop="director",
                 outcome="failed") == 1
    assert value(rows, "gridpilot_agent_loop_last_duration_seconds", loop="watchdog") == 0.5


def test_a_database_that_does_not_answer_is_said(settings: Settings) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    dead = replace(settings, database=DatabaseSettings(
        url=f"postgresql+psycopg://postgres@127.0.0.1:{closed}/gone", connect_timeout=1))
    from taskqueue.db.database import engine_for, make_session_factory

    factory = make_session_factory(engine_for(dead.database))
    metrics = AgentMetrics(AgentContext(dead, factory), {"watchdog": 60})
    try:
        metrics.record("watchdog", failed=True, seconds=1.0)
        rows = samples(metrics.render().decode())
    finally:
        metrics.dispose()
    assert value(rows, "gridpilot_database_up") == 0
    assert value(rows, "gridpilot_agent_loop_runs_total", outcome="failed") == 1
    assert not [r for r in rows if r[0].startswith("gridpilot_agent_loop_last_seen")]


def test_the_endpoint_admits_the_matchers_scrapers_only(db: Database,
                                                        settings: Settings) -> None:
    ctx = AgentContext(_settings(settings), db.factory)
    metrics = AgentMetrics(ctx, {"watchdog": 60})
    server = MetricsServer(metrics, f"127.0.0.1:{_free_port()}")
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert requests.get(f"{base}/metrics", timeout=10).status_code == 401
        wrong = requests.get(f"{base}/metrics", timeout=10,
                             headers={"Authorization": "Bearer " + "y" * 43})
        assert wrong.status_code == 401
        assert wrong.headers["WWW-Authenticate"].startswith("Bearer")
        good = requests.get(f"{base}/metrics", timeout=10,
                            headers={"Authorization": f"Bearer {TOKEN}"})
        assert good.status_code == 200
        assert good.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert value(samples(good.text), "gridpilot_database_up") == 1
        assert requests.get(f"{base}/other", timeout=10,
                            headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 404
    finally:
        server.stop()
        metrics.dispose()
    allowed = AgentContext(replace(settings, matcher=replace(
        settings.matcher, metrics_allow=("127.0.0.0/8",))), db.factory)
    metrics = AgentMetrics(allowed, {})
    server = MetricsServer(metrics, f"127.0.0.1:{_free_port()}")
    server.start()
    try:
        assert requests.get(f"http://127.0.0.1:{server.port}/metrics",
                            timeout=10).status_code == 200
    finally:
        server.stop()
        metrics.dispose()


def test_the_endpoint_admits_an_operator_s_token_as_the_matcher_does(
        db: Database, settings: Settings) -> None:
    """The README: the agents answer the same scrapers as the matcher's /metrics, an
    operator's token among them (judged by the matcher's own rules, as ``gridpilot agents``
    wires them); a user's token is refused as the matcher refuses it."""
    from matcher.idp import IdentityProviders
    from matcher.service import metrics_token_judge
    from taskqueue.tokens import issue_token

    secret = "agent-metrics-secret-0123456789abcdef"
    ctx = AgentContext(_settings(settings), db.factory,
                       metrics_judge=metrics_token_judge(secret, IdentityProviders(())))
    metrics = AgentMetrics(ctx, {"watchdog": 60})
    server = MetricsServer(metrics, f"127.0.0.1:{_free_port()}")
    server.start()
    url = f"http://127.0.0.1:{server.port}/metrics"
    operator = issue_token(secret, subject="olga", role="operator", vo="lhcb",
                           group="lhcb_admin", lifetime=600)
    user = issue_token(secret, subject="alice", role="user", vo="lhcb", group="lhcb_user",
                       lifetime=600)
    try:
        good = requests.get(url, timeout=10, headers={"Authorization": f"Bearer {operator}"})
        assert good.status_code == 200, good.text
        assert value(samples(good.text), "gridpilot_database_up") == 1
        refused = requests.get(url, timeout=10, headers={"Authorization": f"Bearer {user}"})
        assert refused.status_code == 403, refused.text
        assert "it needs the role operator" in refused.text
        forged = issue_token("another-secret-0123456789abcdef", subject="olga",
                             role="operator", vo="lhcb", group="lhcb_admin", lifetime=600)
        bad = requests.get(url, timeout=10, headers={"Authorization": f"Bearer {forged}"})
        assert bad.status_code == 401 and "the token is not valid" in bad.text
        assert requests.get(url, timeout=10, headers={"Authorization": f"Bearer {TOKEN}"}
                            ).status_code == 200
    finally:
        server.stop()
        metrics.dispose()


def test_an_address_in_use_is_a_clear_error(db: Database, settings: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        metrics = AgentMetrics(AgentContext(settings, db.factory), {})
        with pytest.raises(ConfigurationError, match=rf"agents\.metrics_bind 127\.0\.0\.1:"
                                                     rf"{port}: cannot listen"):
            MetricsServer(metrics, f"127.0.0.1:{port}")


def test_the_agents_answer_while_their_loops_run(db: Database, settings: Settings) -> None:
    port = _free_port()
    ctx = AgentContext(_settings(settings, metrics_bind=f"127.0.0.1:{port}"), db.factory)
    runner = Agents(ctx, ["cleanup"])
    scraped: list[str] = []

    def sleep(_seconds: float) -> None:  # the loop's pause: scrape, then stop
        scraped.append(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10,
                                    headers={"Authorization": f"Bearer {TOKEN}"}).text)
        runner.stopping = True

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        runner.run_forever(sleep=sleep)  # in the main thread: it installs signal handlers
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    rows = samples(scraped[0])
    assert value(rows, "gridpilot_agent_loop_runs_total", loop="cleanup", outcome="ok") == 1
    assert value(rows, "gridpilot_agent_loop_interval_seconds", loop="cleanup") == (
        settings.agents.cleanup_interval)
    with pytest.raises(requests.ConnectionError):  # the server is gone with the loops
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
