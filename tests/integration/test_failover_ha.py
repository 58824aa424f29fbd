"""gridpilot on the highly available PostgreSQL of tools/pg-ha (two members under Patroni, a
synchronous standby, etcd, HAProxy checking Patroni's GET /primary), under pilot load: 16
pilot threads claim and report through a real ``gridpilot serve`` while bulk submissions come
in, and the database fails under them: the primary's host dies (SIGKILL of its Patroni and
postmaster), a planned switchover, the standby dies and rejoins, etcd is lost and restarted,
and (with ``tools/pg-ha up --etcd-members 3``) etcd loses its leader and keeps its quorum.

Each scenario asserts that no job was handed to two pilots, none was lost, every job ended
Done through legal moves only, and that every request refused meanwhile said when to come
back (503 with Retry-After, never a 500). The matcher and the agents are never restarted.
The seconds without a match, the refusals, and the latency of the pilots' requests before,
during and after the failure (p50, p99, max of matches and of reports) of each are written
to ``work/artifacts/ha/<scenario>.json`` (or ``$GRIDPILOT_TEST_ARTIFACTS``).

GRIDPILOT_TEST_HA_VIA=multihost runs them with libpq's multi-host URL
(``target_session_attrs=read-write``) instead of HAProxy, to compare the two (figures in
``<scenario>-multihost.json``)."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from gridpilot import schema
from gridpilot.devserver import free_port
from matcher.auth import issue_token
from pilot.client import Backoff, MatcherClient, RefusedError, TransientError
from taskqueue.core.states import JobStatus, is_allowed
from taskqueue.db.database import make_engine, make_session_factory
from taskqueue.db.models import AgentRun, Job, JobStatusHistory
from tests.integration.conftest import ROOT, HACluster
from tests.integration.test_topology import Ledger, RecordedSession

pytestmark = pytest.mark.slow

SECRET = "ha-failover-secret-0123456789abcdef"
SITE = "LCG.CERN.cern"
VO = "lhcb"
PILOTS = 16
#: Jobs submitted before the pilots start, and by each bulk submission while they run.
FIRST_JOBS, BULK_JOBS = 300, 20
#: The agents return a match whose answer was lost after this many seconds.
#: How the matcher and the agents reach the primary: "haproxy" or "multihost".
VIA = os.environ.get("GRIDPILOT_TEST_HA_VIA", "haproxy")
#: Seconds of steady load measured before the failure, and after matching works again.
SETTLE = 8.0
AGENT_SETTINGS = {"GRIDPILOT_AGENTS_MATCHED_LEASE": "10",
                  "GRIDPILOT_AGENTS_WATCHDOG_INTERVAL": "2",
                  "GRIDPILOT_AGENTS_OPTIMIZER_INTERVAL": "2"}


@dataclass
class Grid:
    url: str
    database_url: str
    logs: Path
    #: ``gridpilot serve`` and ``gridpilot agents``: never restarted by the tests.
    processes: list[subprocess.Popen[bytes]]
    secret: str = SECRET
    #: The CA to trust (the topology's TLS), or "" for plain HTTP.
    ca: str = ""
    #: tools/topology's folder when the grid is that deployment.
    topology: Path | None = None


def _wait_for(what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def ha_grid(ha_cluster: HACluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grid]:
    """A database of its own on the cluster, its schema, one ``gridpilot serve`` (two
    workers) and ``gridpilot agents`` (the watchdog, to return matches whose answer was
    lost), all reaching the primary through HAProxy."""
    name = f"gp_ha_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(ha_cluster.url, isolation_level="AUTOCOMMIT")
    base = ha_cluster.env["GRIDPILOT_HA_MULTIHOST_URL"] if VIA == "multihost" else ha_cluster.url
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url, statement_timeout=0)
    schema.upgrade(engine)
    engine.dispose()
    logs = tmp_path_factory.mktemp("ha-grid")
    port = free_port()
    env = {**os.environ, **AGENT_SETTINGS, "GRIDPILOT_DATABASE_URL": url,
           "GRIDPILOT_AUTH_SECRET": SECRET,
           "GRIDPILOT_RESOURCES_FILE": str(ROOT / "conf" / "resources.toml"),
           "GRIDPILOT_MATCHER_URL": f"http://127.0.0.1:{port}",
           "GRIDPILOT_MATCHER_METRICS_DIR": str(logs / "metrics"),
           "GRIDPILOT_SANDBOXES_DIRECTORY": str(logs / "sandboxes")}
    processes = []
    try:
        for command, log in (
                (["serve", "--bind", f"127.0.0.1:{port}", "--workers", "2"], "serve.log"),
                (["agents", "watchdog", "optimizer"], "agents.log")):
            with (logs / log).open("wb") as output:
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "gridpilot", *command], env=env, cwd=logs,
                    stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                    start_new_session=True))

        def healthy() -> bool:
            assert processes[0].poll() is None, (logs / "serve.log").read_text()[-3000:]
            try:
                return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).ok
            except requests.RequestException:
                return False

        _wait_for("gridpilot serve healthy", healthy, 120)
        yield Grid(f"http://127.0.0.1:{port}", url, logs, processes)
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        admin.dispose()  # its connection may have died with a primary: a new one
        admin = create_engine(ha_cluster.url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        _wait_for("the database dropped", lambda: _drop(admin, name), 60)


def _drop(admin: Engine, name: str) -> bool:
    try:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    except OperationalError:
        return False
    return True


def _detail(text: str) -> str:
    try:
        return str(json.loads(text).get("detail", ""))[:90]
    except ValueError:
        return text[:90]


# -- load -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    """One request of a pilot, timed by the pilot around the client's call (the answer read
    whole): ``kind`` match or report, its start and end (``time.monotonic()``), and its
    outcome: ok, refused (an answer of 4xx), unavailable (503, or no answer at all)."""

    kind: str
    start: float
    end: float
    outcome: str


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0 < q <= 1) of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(round(q * len(ordered), 9)) - 1)]


def latency_windows(calls: list[Call], fault: float, recovered: float, end: float,
                    settle: float = SETTLE) -> dict[str, dict[str, dict[str, float | int]]]:
    """The pilots' requests in three windows, by kind: "before" the failure (those that
    started and ended in the ``settle`` seconds before ``fault``), "during" it (those under
    way at any moment from ``fault`` to ``recovered``, the end of the first match that
    succeeded after it), "after" (those started in the ``settle`` seconds from
    ``recovered``, and before ``end``). Each: requests, ok, p50, p99 and max in ms (0 when
    the window has none)."""
    windows: dict[str, Callable[[Call], bool]] = {
        "before": lambda c: c.start >= fault - settle and c.end < fault,
        "during": lambda c: c.end >= fault and c.start < recovered,
        "after": lambda c: recovered <= c.start < min(recovered + settle, end),
    }
    figures: dict[str, dict[str, dict[str, float | int]]] = {}
    for kind in ("match", "report"):
        figures[kind] = {}
        for window, within in windows.items():
            found = [c for c in calls if c.kind == kind and within(c)]
            ms = [(c.end - c.start) * 1000 for c in found]
            figures[kind][window] = {
                "requests": len(found), "ok": sum(c.outcome == "ok" for c in found),
                "p50_ms": round(percentile(ms, 0.5)) if ms else 0,
                "p99_ms": round(percentile(ms, 0.99)) if ms else 0,
                "max_ms": round(max(ms)) if ms else 0}
    return figures

class Load:
    """16 pilot threads matching, confirming (Running) and finishing (Done) jobs, and a
    submitter sending bulk submissions, all through the matcher's HTTP API."""

    def __init__(self, grid: Grid, group: str) -> None:
        self.grid, self.group = grid, group
        self.ledger = Ledger()
        self.submitted: list[int] = []
        self.calls: list[Call] = []
        self.started = self.ended = 0.0
        self.stop, self.stop_submitting = threading.Event(), threading.Event()
        self.pilot_token = issue_token(grid.secret, subject="ha-pilots", role="pilot", vo=VO,
                                       group="lhcb_pilot", lifetime=3600, site=SITE)
        self.user_token = issue_token(grid.secret, subject="ha-user", role="user", vo=VO,
                                      group="lhcb_user", lifetime=3600)
        self.threads = [threading.Thread(target=self._pilot, args=(i,), name=f"pilot-{i}")
                        for i in range(PILOTS)]
        self.threads.append(threading.Thread(target=self._submitter, name="submitter"))

    def submit(self, jobs: int) -> bool:
        """One bulk submission; whether the service took it (its ids are then recorded)."""
        jdl = (f'[ Executable = "/bin/true"; Parameters = {jobs}; JobGroup = "{self.group}";'
               f' Site = "{SITE}"; CPUTime = 3600; ]')
        session = RecordedSession(self.ledger, self.grid.ca)
        try:
            answer = session.post(f"{self.grid.url}/api/v1/jobs", data=jdl.encode(),
                                  headers={"Authorization": f"Bearer {self.user_token}",
                                           "Content-Type": "text/plain"}, timeout=60)
        except requests.RequestException:
            return False
        finally:
            session.close()
        if answer.status_code == 201:
            self.submitted.extend(answer.json()["job_ids"])
            return True
        if answer.status_code != 503:
            self.ledger.errors.append(f"submission: {answer.status_code} {answer.text[:300]}")
        return False

    def _submitter(self) -> None:
        while not self.stop_submitting.is_set():
            self.submit(BULK_JOBS)
            time.sleep(0.5)

    def _pilot(self, index: int) -> None:
        ledger, reference = self.ledger, f"ha-{self.group}-pilot-{index}"
        client = MatcherClient(self.grid.url, self.pilot_token, timeout=40,
                               session=RecordedSession(ledger, self.grid.ca))
        rng = random.Random(index)
        backoff = Backoff(base=0.1, cap=2.0, rng=rng)
        resource = {"vo": VO, "site": SITE, "ce": "ce503.cern.ch",
                    "pilot_reference": reference, "cpu_time": 10**6}

        def timed(kind: str, call: Callable[[], Any]) -> Any:
            start, outcome = time.monotonic(), "error"
            try:
                answer = call()
                outcome = "ok"
                return answer
            except RefusedError:
                outcome = "refused"
                raise
            except TransientError:
                outcome = "unavailable"
                raise
            finally:
                self.calls.append(Call(kind, start, time.monotonic(), outcome))

        def report(job_id: int, status: str) -> bool:
            body: dict[str, Any] = {"pilot_reference": reference, "status": status}
            if status == "Done":
                body["exit_code"] = 0
            retry = Backoff(base=0.1, cap=2.0, rng=rng)
            while not self.stop.is_set():
                try:
                    timed("report", partial(client.report, job_id, body))
                    return True
                except RefusedError as exc:
                    ledger.refused.append((status, job_id, f"{exc.status} {exc.detail}"))
                    return False
                except TransientError:
                    time.sleep(retry.next_delay())
            return False

        try:
            while not self.stop.is_set():
                try:
                    answer = timed("match", partial(client.match, resource,
                                                    count=rng.choice((1, 2))))
                except TransientError:
                    time.sleep(backoff.next_delay())
                    continue
                backoff.reset()
                if not answer.jobs:
                    time.sleep(0.2)
                    continue
                for job in answer.jobs:
                    if not report(job.job_id, "Running"):
                        continue  # taken back (unconfirmed for too long): another pilot runs it
                    ledger.confirmed.append((reference, job.job_id))
                    if report(job.job_id, "Done"):
                        ledger.done.append(job.job_id)
        except Exception as exc:  # the test fails with it
            ledger.errors.append(f"{reference}: {type(exc).__name__}: {exc}")

    def matched_after(self, at: float) -> float:
        """The end of the first match that succeeded having started after ``at`` (one under
        way at ``at`` may have been served before a failure came), or 0."""
        return min((c.end for c in self.calls
                    if c.kind == "match" and c.outcome == "ok" and c.start > at), default=0.0)

    def __enter__(self) -> Load:
        _wait_for("the first submission", lambda: self.submit(FIRST_JOBS), 60)
        self.started = time.monotonic()
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop_submitting.set()
        self.stop.set()
        self.ended = time.monotonic()
        for thread in self.threads:
            thread.join(timeout=120)


def _unfinished(grid: Grid, group: str) -> int:
    engine = make_engine(grid.database_url)
    try:
        with make_session_factory(engine)() as session:
            return int(session.execute(select(func.count()).where(
                Job.job_group == group, Job.status != JobStatus.DONE.value)).scalar_one())
    except Exception:  # the database may be failing over; ask again
        return -1
    finally:
        engine.dispose()


def _turn_ended_after(grid: Grid, loop: str, at: datetime) -> bool:
    engine = make_engine(grid.database_url)
    try:
        with make_session_factory(engine)() as session:
            ended = session.scalar(select(AgentRun.finished_at).where(AgentRun.name == loop))
    finally:
        engine.dispose()
    return ended is not None and ended > at


def _scenario(grid: Grid, ha: HACluster, name: str, fault: Callable[[], object],
              repair: Callable[[], object]) -> dict[str, Any]:
    """Run the load, ``fault`` once a sixth of the first jobs are done, ``repair`` once
    matching works again; then let every job finish and check the outcome."""
    events: dict[str, float] = {}
    # Each scenario starts from a whole cluster (what an earlier one left is started again)
    # with its synchronous standby in place.
    ha.tool("up")
    _wait_for("a leader and a synchronous standby", lambda: sorted(
        ha.members().values()) == ["leader", "sync_standby"], 120)
    roles_before = ha.members()
    with Load(grid, name) as load:
        ledger = load.ledger
        # Steady load for the latency before the failure: 50 jobs done, and the seconds of
        # its window after the first of them (connections made, caches warm).
        _wait_for("50 jobs done", lambda: len(ledger.done) >= 50 or ledger.errors, 120)
        time.sleep(max(0.0, load.started + SETTLE + 2 - time.monotonic()))
        events["fault"] = time.monotonic()
        fault_at = datetime.now(UTC)
        fault()
        events["fault done"] = time.monotonic()
        try:
            _wait_for("a match after the fault", lambda: load.matched_after(
                events["fault done"]) or ledger.errors, 120)
        finally:
            repair()  # also when the service did not come back: the next test needs it
        events["first match after"] = load.matched_after(events["fault done"])
        events["repaired"] = time.monotonic()

        def recovered() -> float:
            """The end of the first match that succeeded after the failure: after the fault
            command, and after every pilot request that failed (503 or no answer) having
            started within SETTLE seconds of it (a failure may come late: etcd's restart)."""
            failing = [c.end for c in load.calls if c.outcome == "unavailable"
                       and events["fault"] <= c.start <= events["fault done"] + SETTLE]
            since = max([events["fault done"], *failing])
            return load.matched_after(since)

        _wait_for("matches after the failure's last refusal", lambda: (
            time.monotonic() > events["fault done"] + SETTLE and recovered())
            or ledger.errors, 120)
        events["recovered"] = recovered()
        # Bulk submissions on the repaired cluster, and load for the latency's window after.
        time.sleep(max(2.0, events["recovered"] + SETTLE - time.monotonic()))
        load.stop_submitting.set()
        _wait_for("every job done", lambda: (
            (set(load.submitted) <= set(ledger.done) and _unfinished(grid, name) == 0)
            or ledger.errors), 180)
    roles_after = ha.members()

    assert ledger.errors == []
    # The matcher and the agents rode it out in the same processes; the agents' turns (their
    # leases are rows of agent_runs) go on after it.
    assert all(process.poll() is None for process in grid.processes)
    if grid.topology is not None:
        status = json.loads(subprocess.run(
            [sys.executable, str(ROOT / "tools" / "topology"), "status", "--dir",
             str(grid.topology)], capture_output=True, text=True, check=True).stdout)
        assert all(status["alive"].values()), status["alive"]
    _wait_for("a watchdog turn ended after the fault",
              lambda: _turn_ended_after(grid, "watchdog", fault_at), 60)
    confirmed = Counter(job_id for _, job_id in ledger.confirmed)
    duplicated = sorted(job_id for job_id, n in confirmed.items() if n > 1)
    assert duplicated == []
    assert Counter(ledger.done) == Counter(set(ledger.done))  # each reported Done once
    # Every refusal says when to come back; none is an internal error.
    server_errors = [asdict(r) for r in ledger.failures
                     if r.status is not None and r.status >= 500
                     and (r.status != 503 or not r.retry_after)]
    assert server_errors == []
    assert {(status, reason.split()[0]) for status, _, reason in ledger.refused} <= {
        ("Running", "403"), ("Running", "409")}, ledger.refused[:5]
    # The database agrees: every job of the scenario Done once, by legal moves only, by
    # the pilot that confirmed it; every submission the service took is there.
    engine = make_engine(grid.database_url)
    try:
        with make_session_factory(engine)() as session:
            jobs = dict(session.execute(select(Job.id, Job.status)
                                        .where(Job.job_group == name)).all())
            holders = dict(session.execute(select(Job.id, Job.pilot_reference)
                                           .where(Job.job_group == name)).all())
            history: dict[int, list[str]] = {}
            for job_id, status in session.execute(
                    select(JobStatusHistory.job_id, JobStatusHistory.status)
                    .join(Job, Job.id == JobStatusHistory.job_id)
                    .where(Job.job_group == name).order_by(JobStatusHistory.id)):
                history.setdefault(job_id, []).append(status)
    finally:
        engine.dispose()
    lost = sorted(set(load.submitted) - set(jobs))
    assert lost == []
    assert set(jobs.values()) == {JobStatus.DONE.value}
    assert set(ledger.done) == set(jobs)
    assert all(holders[job_id] == reference for reference, job_id in ledger.confirmed)
    illegal = {job_id: moves for job_id, moves in history.items()
               if moves.count("Done") != 1 or not all(
                   a == b or is_allowed(JobStatus(a), JobStatus(b))  # a == b: a minor status
                   for a, b in itertools.pairwise(moves))}
    assert illegal == {}

    latency = latency_windows(load.calls, events["fault"], events["recovered"], load.ended)
    # Every window holds requests of the pilots: load ran before the failure and after it,
    # and the request that got the first match after the failure was under way during it.
    empty = [f"{kind} {window}" for kind, window in (
        ("match", "before"), ("report", "before"), ("match", "during"), ("match", "after"),
        ("report", "after")) if latency[kind][window]["requests"] == 0]
    assert empty == [], latency

    failed = [r for r in ledger.failures if r.at >= events["fault"] - 1]
    before = [t for t in ledger.matched_at if t <= events["fault"]]
    figures = {
        "scenario": name, "via": VIA, "pilots": PILOTS, "jobs": len(jobs),
        "submitted_and_acknowledged": len(load.submitted),
        "jobs_not_acknowledged_but_stored": len(set(jobs) - set(load.submitted)),
        "duplicated": 0, "lost": 0,
        "roles_before": roles_before, "roles_after": roles_after,
        "fault_command_s": round(events["fault done"] - events["fault"], 2),
        "seconds_without_a_match": round(
            events["first match after"] - (max(before) if before else events["fault"]), 2),
        # From the last match before the failure to the first after its last refusal: the
        # longest stretch without one in it (seconds_without_a_match ends at the first match
        # after the fault command, before a failure that comes late).
        "longest_gap_between_matches_s": round(max(
            (b - a for a, b in itertools.pairwise(sorted(
                t for t in ledger.matched_at
                if (max(before) if before else events["fault"]) <= t <= events["recovered"]))),
            default=0.0), 2),
        "seconds_until_recovered": round(events["recovered"] - events["fault"], 2),
        "failed_requests": len(failed),
        "by_status": dict(Counter(str(r.status) for r in failed)),
        "answers": dict(Counter(f"{r.status} {_detail(r.detail)}" for r in failed)
                        .most_common(4)),
        "running_reports_refused_after_a_lost_answer": len(ledger.refused),
        "jobs_matched_more_than_once": sum(1 for moves in history.values()
                                           if moves.count("Matched") > 1),
        "latency_windows_s": {
            "before": [-SETTLE, 0.0],
            "during": [0.0, round(events["recovered"] - events["fault"], 2)],
            "after": [round(events["recovered"] - events["fault"], 2), round(
                min(events["recovered"] + SETTLE, load.ended) - events["fault"], 2)]},
        "latency": latency,
        "match_p99_after_over_before": round(
            latency["match"]["after"]["p99_ms"] / max(1, latency["match"]["before"]["p99_ms"]),
            2),
        "load_average": round(os.getloadavg()[0], 2), "cores": os.cpu_count(),
    }
    base = Path(os.environ.get("GRIDPILOT_TEST_ARTIFACTS") or ROOT / "work" / "artifacts")
    (base / "ha").mkdir(parents=True, exist_ok=True)
    suffix = "" if VIA == "haproxy" else f"-{VIA}"
    (base / "ha" / f"{name}{suffix}.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"{name}:", json.dumps(figures))
    print(f"{name} latency, ms (p50/p99/max, requests) before | during | after:")
    for kind in ("match", "report"):
        print(f"  {kind:6}", " | ".join(
            f"{w['p50_ms']}/{w['p99_ms']}/{w['max_ms']} ({w['requests']})"
            for w in latency[kind].values()))
    return figures


# -- the scenarios ----------------------------------------------------------------------------

def test_latency_windows_split_the_requests_at_the_failure() -> None:
    """A request under way when the failure came counts in "during", not "before"; one that
    started once matching worked again counts in "after", within its window only."""
    calls = [Call("match", 1.0, 1.1, "ok"), Call("match", 2.0, 2.3, "ok"),
             Call("report", 2.5, 2.6, "ok"),
             Call("match", 9.9, 14.0, "unavailable"),  # under way at the failure (10)
             Call("match", 11.0, 11.5, "unavailable"), Call("match", 13.0, 15.0, "ok"),
             Call("match", 15.0, 15.2, "ok"), Call("report", 15.1, 15.3, "refused"),
             Call("match", 30.0, 30.1, "ok")]  # past the window after
    figures = latency_windows(calls, fault=10.0, recovered=15.0, end=40.0, settle=9.0)
    assert figures["match"]["before"] == {"requests": 2, "ok": 2, "p50_ms": 100,
                                          "p99_ms": 300, "max_ms": 300}
    assert figures["match"]["during"] == {"requests": 3, "ok": 1, "p50_ms": 2000,
                                          "p99_ms": 4100, "max_ms": 4100}
    assert figures["match"]["after"]["requests"] == 1
    assert figures["report"]["after"] == {"requests": 1, "ok": 0, "p50_ms": 200,
                                          "p99_ms": 200, "max_ms": 200}
    assert figures["report"]["during"]["requests"] == 0
    assert percentile([float(v) for v in range(1, 201)], 0.99) == 198.0


def test_the_primary_dies_under_load(ha_grid: Grid, ha_cluster: HACluster) -> None:
    """The primary's host dies (SIGKILL of Patroni and the postmaster): the synchronous
    standby is promoted once the leader key expires, HAProxy follows Patroni's /primary, and
    the matcher reconnects without a restart. The old primary rejoins as a standby."""
    killed: list[str] = []
    figures = _scenario(ha_grid, ha_cluster, "primary-killed",
                        lambda: killed.append(ha_cluster.tool("kill", "primary")),
                        lambda: ha_cluster.tool("start", killed[0]))
    assert figures["roles_after"][killed[0]] != "leader"


def test_a_planned_switchover_under_load(ha_grid: Grid, ha_cluster: HACluster) -> None:
    before = ha_cluster.members()
    figures = _scenario(ha_grid, ha_cluster, "switchover",
                        lambda: ha_cluster.tool("switchover"), lambda: None)
    leader = next(name for name, role in before.items() if role == "leader")
    assert figures["roles_after"][leader] != "leader"


def test_the_standby_dies_and_rejoins_under_load(ha_grid: Grid, ha_cluster: HACluster
                                                 ) -> None:
    """Synchronous mode without its standby: Patroni stops waiting for it (the primary
    commits alone) and makes it synchronous again once it is back."""
    killed: list[str] = []
    _scenario(ha_grid, ha_cluster, "standby-killed",
              lambda: killed.append(ha_cluster.tool("kill", "standby")),
              lambda: ha_cluster.tool("start", killed[0]))
    _wait_for("a synchronous standby again",
              lambda: "sync_standby" in ha_cluster.members().values(), 60)


def test_etcd_is_lost_and_restarted_under_load(ha_grid: Grid, ha_cluster: HACluster
                                               ) -> None:
    """The consensus store dies (every member: one here unless tools/pg-ha runs three).
    The primary cannot renew its leader key; it stays primary while etcd is back within
    retry_timeout, and demotes itself otherwise, until a leader is elected again."""
    members = _etcd_members(ha_cluster)

    def lose_etcd() -> None:
        for member in members:
            ha_cluster.tool("kill", member)
        time.sleep(3)
        for member in members:
            ha_cluster.tool("start", member)

    _scenario(ha_grid, ha_cluster, "etcd-restarted", lose_etcd, lambda: None)
    _wait_for("a leader and a synchronous standby", lambda: sorted(
        ha_cluster.members().values()) == ["leader", "sync_standby"], 60)


def _etcd_members(ha: HACluster) -> list[str]:
    """The etcd members' service names (etcd, etcd2, etcd3)."""
    return sorted(name for name in json.loads(ha.tool("status"))["alive"]
                  if name.startswith("etcd"))


def test_etcd_loses_its_leader_of_three_under_load(ha_grid: Grid, ha_cluster: HACluster
                                                   ) -> None:
    """With three etcd members (``tools/pg-ha up --etcd-members 3``) the one that leads
    dies: the other two keep quorum and elect a leader among them within about a second,
    Patroni renews its leader key through them, and the primary stays the primary. Skipped
    on a cluster of one etcd member, where losing the leader is losing etcd (the test
    above)."""
    if len(_etcd_members(ha_cluster)) != 3:
        pytest.skip("the HA cluster runs one etcd member (tools/pg-ha down; "
                    "tools/pg-ha up --etcd-members 3)")
    killed: list[str] = []
    figures = _scenario(ha_grid, ha_cluster, "etcd-leader-lost",
                        lambda: killed.append(ha_cluster.tool("kill", "etcd-leader")),
                        lambda: ha_cluster.tool("start", killed[0]))
    assert figures["roles_after"] == figures["roles_before"]  # quorum kept: no failover
    assert json.loads(ha_cluster.tool("status"))["etcd_leader"] is not None


# -- the whole deployment on it ---------------------------------------------------------------

@pytest.fixture(scope="module")
def ha_topology(ha_cluster: HACluster) -> Iterator[Grid]:
    """tools/topology (nginx, HAProxy, three matchers, PgBouncer in transaction mode, the
    agents) with PgBouncer in front of the HA cluster's HAProxy."""
    folder = Path(tempfile.mkdtemp(prefix="gridpilot-topology-ha-"))
    folder.chmod(0o755)
    tool = [sys.executable, str(ROOT / "tools" / "topology")]
    up = subprocess.run([*tool, "up", "--dir", str(folder), "--postgres", ha_cluster.url],
                        capture_output=True, text=True, timeout=900)
    try:
        assert up.returncode == 0, f"tools/topology up failed: {up.stderr}"
        state = json.loads((folder / "state.json").read_text())
        yield Grid(state["url"], state["direct_url"], folder, [], secret=state["secret"],
                   ca=state["ca"], topology=folder)
    finally:
        subprocess.run([*tool, "down", "--dir", str(folder)], capture_output=True, timeout=300)
        shutil.rmtree(folder, ignore_errors=True)


def test_the_topology_follows_the_primary_through_pgbouncer(
        ha_topology: Grid, ha_cluster: HACluster) -> None:
    """The whole deployment on the HA database: PgBouncer's server connections go through
    the cluster's HAProxy; the primary dies under load and every service carries on,
    nothing restarted."""
    killed: list[str] = []
    figures = _scenario(ha_topology, ha_cluster, "topology-primary-killed",
                        lambda: killed.append(ha_cluster.tool("kill", "primary")),
                        lambda: ha_cluster.tool("start", killed[0]))
    assert figures["roles_after"][killed[0]] != "leader"
