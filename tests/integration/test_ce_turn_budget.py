"""A slow CE beside a healthy one (issue 33 item 4). A CE answering each request just under
``[agents] ce_timeout`` takes no more than ``[agents] ce_turn_budget`` of a turn: the director
does not upload pilot after pilot to it, one deadline each, while the CE after it waits; the
pilots loop does not fetch log after log from it. Both CEs are real HTTPS servers on loopback
(tests/integration/hostile_ce.py) that A-REX's REST answers are imitated by; the database is
SQLite (what is tested is the CE path, which does not depend on it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import select

from agents.ce.arc import OUTPUT_FETCHES
from agents.context import AgentContext
from agents.director import Director, compute_elements
from agents.pilotstatus import PilotFollower
from gridpilot import schema
from optimizers.chain import Identity, submissions_from_text, submit
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine, make_session_factory
from taskqueue.db.models import DirectorQueue, Pilot
from taskqueue.pilots.pilotlogs import STORED
from taskqueue.pilots.records import record_new_pilots, record_submission
from tests.helpers import write_token_file
from tests.integration.hostile_ce import VERSIONS, HostileCE, Lab, Reply, lab, reply

__all__ = ["lab"]  # the fixture, used by name

SECRET = "ce-turn-budget-tests-signing-secret-0123456789"
USER = Identity(vo="lhcb", owner="alice", owner_group="lhcb_user")
#: Pilots each queue gets in one cycle (as many jobs wait, which either queue can run).
PILOTS = 10
#: The slow CE answers every request after this many seconds, under its deadline.
SLOW = 1.0
TIMEOUT, BUDGET = 2, 3

RESOURCES = """\
[JobDescription]
VO = "list"
"""

SITE = """
[Sites."{site}"]
VO = "lhcb"
HS06 = 10.0
MaxCPUTime = 1440

[Sites."{site}".CEs."ce"]
Executor = "arc"
Endpoint = "{url}/arex"
TokenFile = "{token}"
CABundle = "{ca}"

[Sites."{site}".CEs."ce".Queues.q]
NumberOfProcessors = 1
"""

SLOW_QUEUE, HEALTHY_QUEUE = "A.Slow.test/ce/q", "B.Healthy.test/ce/q"


class ArcImitation:
    """What A-REX answers to a director and to the pilots loop: its REST versions, ``PILOTS``
    new jobs, uploads taken; every job asked for in ``state``, its record and diag file (exit
    code 0), an empty session directory, a clean taken; anything else a 500. Each answer after
    ``delay`` seconds; the time of the first request is kept."""

    def __init__(self, delay: float, *, state: str = "RUNNING") -> None:
        self.delay = delay
        self.state = state
        self.first: float | None = None

    def __call__(self, method: str, path: str) -> Reply:
        return self.with_body(method, path, b"")

    def with_body(self, method: str, path: str, body: bytes) -> Reply:
        if self.first is None:
            self.first = time.monotonic()
        if path.rstrip("/") == "/arex/rest":
            answer = reply(VERSIONS)
        elif method == "POST" and "action=new" in path:
            created = b'{"job": [' + b", ".join(
                b'{"id": "j%d", "status-code": "201", "reason": "Created"}' % i
                for i in range(PILOTS)) + b"]}"
            answer = reply(created, status="201 Created")
        elif method == "PUT":
            answer = reply(b"", status="200 OK")
        elif method == "POST" and ("action=status" in path or "action=clean" in path):
            ids = [j["id"] for j in json.loads(body)["job"]]
            code, state = ("200", self.state) if "status" in path else ("202", "")
            answer = reply(json.dumps({"job": [{"id": i, "status-code": code, "state": state}
                                               for i in ids]}).encode(), status="201 Created")
        elif method == "POST" and "action=info" in path:  # each job's record, exit code 0
            ids = [j["id"] for j in json.loads(body)["job"]]
            record = {"ComputingActivity": {"State": [f"arcrest:{self.state}"], "ExitCode": "0"}}
            answer = reply(json.dumps({"job": [{"id": i, "status-code": "200",
                                                "info_document": record} for i in ids]}).encode(),
                           status="201 Created")
        elif method == "GET" and path.endswith("/diagnose/diag"):
            answer = reply(b"exitcode=0\n")
        elif method == "GET" and "/session" in path:
            answer = reply(b"")
        else:
            answer = reply(b"", status="500 Internal Server Error")
        return replace(answer, delay=self.delay)


@dataclass
class TwoCes:
    ctx: AgentContext
    slow: HostileCE
    healthy: HostileCE
    healthy_answers: ArcImitation


#: Ended pilots the slow CE holds, and running ones the healthy CE holds, in the pilots loop.
ENDED, RUNNING = 4, 2


@pytest.fixture()
def two_ces(lab: Lab, tmp_path: Path) -> Iterator[TwoCes]:
    healthy_answers = ArcImitation(0.0)
    slow = lab.ce(ArcImitation(SLOW, state="FINISHED"))
    healthy = lab.ce(healthy_answers)
    token = write_token_file(tmp_path / "ce.token", "a.b.c")
    resources = tmp_path / "resources.toml"
    resources.write_text(RESOURCES + "".join(
        SITE.format(site=site, url=server.url, token=token, ca=lab.ca)
        for site, server in (("A.Slow.test", slow), ("B.Healthy.test", healthy))))
    url = f"sqlite:///{tmp_path / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    base = Settings()
    settings = replace(
        base, database=replace(base.database, url=url),
        resources=replace(base.resources, file=str(resources)),
        matcher=replace(base.matcher, url="http://127.0.0.1:9"),
        auth=replace(base.auth, secret=SECRET),
        agents=replace(base.agents, pilot_workdir=str(tmp_path / "pilots"),
                       pilot_command=("/bin/true",), pilots_per_cycle=PILOTS,
                       ce_timeout=TIMEOUT, ce_turn_budget=BUDGET,
                       # What is counted here are the submission's requests: the CE's
                       # state is not read (it would be one more request of the budget).
                       ce_info_period=0))
    ctx = AgentContext(settings, make_session_factory(engine), secret=SECRET)
    jdl = f'[ Executable = "/bin/echo"; Arguments = "hi"; CPUTime = 300; Parameters = {PILOTS} ]'
    result = ctx.transaction(lambda s: submit(s, submissions_from_text(jdl, "jdl"), USER,
                                              ctx.chain_context()))
    assert len(result.waiting) == PILOTS, result.failed
    try:
        yield TwoCes(ctx, slow, healthy, healthy_answers)
    finally:
        engine.dispose()


def test_a_slow_ce_takes_its_budget_of_a_cycle_and_the_next_ce_gets_its_pilots(
        two_ces: TwoCes) -> None:
    ctx = two_ces.ctx
    started = time.monotonic()
    report = Director(ctx, compute_elements(ctx)).cycle()
    first = two_ces.healthy_answers.first
    assert first is not None
    # Shown with -s: the figure the commit gives (the healthy CE's wait), never asserted.
    print(f"the healthy CE was first asked {first - started:.2f} s into the cycle; the "
          f"cycle took {time.monotonic() - started:.2f} s")
    assert report.submitted[HEALTHY_QUEUE] == PILOTS, report.line()
    # The slow CE: its versions, the bulk submission, one upload cut at the budget, and the
    # cleanup of the jobs left without their token; no upload after the budget was spent.
    uploads = [r for r in two_ces.slow.requests if r.startswith("PUT ")]
    assert len(uploads) == 1, two_ces.slow.requests
    assert "ce_turn_budget" in report.failed[SLOW_QUEUE], report.line()
    with ctx.factory() as session:
        healthy = session.scalars(select(Pilot).where(Pilot.site == "B.Healthy.test")).all()
        assert sorted(p.status for p in healthy) == ["Submitted"] * PILOTS
        # The slow CE's pilots cut at the budget never ran there: no record of them stays,
        # the queue counts them.
        slow = session.scalars(select(Pilot).where(Pilot.site == "A.Slow.test")).all()
        assert [p.status for p in slow if p.native_id is None] == []
        state = session.get(DirectorQueue, ("A.Slow.test", "ce", "q"))
        assert state is not None and state.unsent_pilots == PILOTS - len(slow)


def test_a_slow_ce_takes_its_budget_of_a_pilots_turn_and_its_logs_come_over_turns(
        two_ces: TwoCes) -> None:
    ctx = two_ces.ctx
    when = datetime.now(UTC)
    # The slow CE's pilots first: the loop serves the CEs in the order of their pilots.
    for site, n in (("A.Slow.test", ENDED), ("B.Healthy.test", RUNNING)):
        references = [f"{site[0]}{i}" for i in range(n)]
        ctx.transaction(partial(record_new_pilots, vo="lhcb", site=site, ce="ce", queue="q",
                                executor="arc", references=references, now=when))
        for i, ref in enumerate(references):
            ctx.transaction(partial(record_submission, reference=ref, native_id=f"j{i}",
                                    now=when))
    follower = PilotFollower(ctx, compute_elements(ctx))
    started = time.monotonic()
    report = follower.turn()
    first = two_ces.healthy_answers.first
    assert first is not None
    print(f"the healthy CE was first asked {first - started:.2f} s into the turn")
    assert not report.failed, report.line()
    (why,) = report.deferred.values()
    assert "ce_turn_budget" in why, report.line()
    with ctx.factory() as session:
        healthy = session.scalars(select(Pilot).where(Pilot.site == "B.Healthy.test")).all()
        assert [p.status for p in healthy] == ["Running"] * RUNNING
        # Slow is not failing: no back-off for its queue.
        state = session.get(DirectorQueue, ("A.Slow.test", "ce", "q"))
        assert state is None or (state.failures, state.skip_until) == (0, None)
    # Each turn asks the slow CE at most what its budget holds (and one request cut at the
    # end of it), outputs being fetched OUTPUT_FETCHES at a time, and its pilots' logs are all
    # kept over a few turns.
    most = (int(BUDGET / SLOW) + 1) * OUTPUT_FETCHES
    for _ in range(3 * ENDED):
        asked = len(two_ces.slow.requests)
        follower.turn()
        assert len(two_ces.slow.requests) - asked <= most, two_ces.slow.requests[asked:]
        with ctx.factory() as session:
            slow = session.scalars(select(Pilot).where(Pilot.site == "A.Slow.test")).all()
            if all(p.log_state == STORED for p in slow):
                break
    assert [(p.status, p.log_state) for p in slow] == [("Done", STORED)] * ENDED
