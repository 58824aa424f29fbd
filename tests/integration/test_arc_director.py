"""The site director through a REAL ARC-CE (tools/arc-localhost: A-REX 6.17 on loopback, its
fork back end): a user's job runs in a pilot the director submitted over ARC's REST interface,
with a token, with an X.509 proxy, and with both (the token authenticates, the proxy is
delegated for the pilot); the pilot is shipped as the pilot bundle and run by the
node's python3 under the CE's local account; the director follows it to its end, keeps its log
(which ``gridpilot-client pilot-log`` prints) and cleans it from the CE. An operator's kill goes
through the CE; a CE that goes down while its pilot runs is followed again once it is back,
and its job is run once.

Each test has a SQLite database of its own (what is tested here is the CE path, which does not
depend on the database; the director's database work is tested on every backend elsewhere).
Skipped locally when A-REX cannot start; failing where CI or GRIDPILOT_TEST_REQUIRE_SERVERS=1
is set (tests/integration/arc.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography import x509
from sqlalchemy import select

from agents.ce import adl
from agents.ce.arc import ArcCE
from agents.ce.arcrest import UNKNOWN, ArcRestClient
from agents.ce.base import CELoad, CEPilot, PilotOutput, PilotSpec
from agents.ce.config import CEConfig
from agents.ce.registry import ComputeElements
from agents.ce.x509proxy import load_credential, make_proxy
from agents.context import AgentContext
from agents.director import Director, compute_elements
from agents.pilotstatus import FollowReport, PilotFollower
from gridpilot import schema
from gridpilot.devserver import matcher_server
from taskqueue.core.settings import Settings
from taskqueue.db.database import make_engine, make_session_factory
from taskqueue.db.models import DirectorQueue, Job, Pilot
from taskqueue.tokens import issue_token
from tests.integration.arc import LocalCe, end_jobs, local_ce, wait_for_states, write_secret

SECRET = "arc-director-tests-signing-secret-0123456789"
SITE, CE, QUEUE = "ARC.Local.test", "localhost", "fork"
ROOT = Path(__file__).resolve().parents[2]
#: How long a pilot's way through the CE may take (the CE notices a job's end within about
#: 20 s, and its information provider refreshes every 10 s).
PATIENCE = 300

RESOURCES = """\
[JobDescription]
VO = "list"

[Sites."{site}"]
VO = "lhcb"
HS06 = 10.0
MaxCPUTime = 60

[Sites."{site}".CEs."{ce}"]
Executor = "arc"
Endpoint = "{endpoint}"
{credential}
CABundle = "{ca}"
BatchQueue = "{queue}"

[Sites."{site}".CEs."{ce}".Queues.{queue}]
NumberOfProcessors = 1
WallTime = 30
"""


@pytest.fixture(scope="session")
def arc_ce() -> LocalCe:
    return local_ce()


@dataclass
class ArcGrid:
    base: str
    ctx: AgentContext
    ces: ComputeElements
    director: Director
    follower: PilotFollower
    user: requests.Session
    url: str

    def submit(self, executable: str, arguments: str) -> int:
        jdl = (f'[ Executable = "{executable}"; Arguments = "{arguments}"; CPUTime = 60; '
               f'Site = "{SITE}" ]')
        answer = self.user.post(f"{self.base}/api/v1/jobs", data=jdl.encode(), timeout=30,
                                headers={"Content-Type": "text/plain"})
        assert answer.status_code == 201, answer.text
        (job_id,) = answer.json()["job_ids"]
        return int(job_id)

    def job(self, job_id: int) -> dict[str, Any]:
        answer = self.user.get(f"{self.base}/api/v1/jobs/{job_id}", timeout=30)
        assert answer.status_code == 200, answer.text
        data: dict[str, Any] = answer.json()
        return data

    def pilot(self) -> Pilot:
        with self.ctx.factory() as session:
            (pilot,) = session.scalars(select(Pilot)).all()
            session.expunge(pilot)
            return pilot

    def follow_until(self, what: str, check: Callable[[], bool], *,
                     allow_failures: bool = False) -> FollowReport:
        deadline = time.monotonic() + PATIENCE
        while True:
            report = self.follower.turn()
            assert allow_failures or not report.failed, report.line()
            if check():
                return report
            if time.monotonic() > deadline:
                p = self.pilot()
                pytest.fail(f"timed out waiting until {what}: pilot {p.reference} "
                            f"{p.status} ({p.reason}); last turn: {report.line()}")
            time.sleep(2)

    def arc(self) -> ArcCE:
        (ce,) = self.ces._built.values()
        assert isinstance(ce, ArcCE)
        return ce


def operator_token() -> str:
    return issue_token(SECRET, subject="olga", role="operator", vo="lhcb", group="lhcb_admin",
                       lifetime=3600)


@contextmanager
def arc_grid(arc_ce: LocalCe, tmp_path: Path, credential: str, *,
             proxy_file: Path | None = None, queue_lines: str = "",
             **agents: Any) -> Iterator[ArcGrid]:
    token_line = f'TokenFile = "{write_secret(tmp_path / "ce.token", arc_ce.token())}"'
    proxy_line = f'ProxyFile = "{proxy_file or arc_ce.proxy}"'
    line = {"token": token_line, "proxy": proxy_line,
            "both": f"{token_line}\n{proxy_line}"}[credential]
    resources = tmp_path / "resources.toml"
    resources.write_text(RESOURCES.format(site=SITE, ce=CE, queue=QUEUE, credential=line,
                                          endpoint=arc_ce.endpoint, ca=arc_ce.ca_bundle)
                         + queue_lines)
    url = f"sqlite:///{tmp_path / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    try:
        with matcher_server(url, SECRET, resources, tmp_path) as base:
            base_settings = Settings()
            settings = replace(
                base_settings, database=replace(base_settings.database, url=url),
                resources=replace(base_settings.resources, file=str(resources)),
                matcher=replace(base_settings.matcher, url=base),
                auth=replace(base_settings.auth, secret=SECRET),
                agents=replace(base_settings.agents, pilot_workdir=str(tmp_path / "pilots"),
                               pilot_idle_timeout=5, **agents))
            ctx = AgentContext(settings, make_session_factory(engine), secret=SECRET)
            ces = compute_elements(ctx)
            user = requests.Session()
            user.headers["Authorization"] = "Bearer " + issue_token(
                SECRET, subject="alice", role="user", vo="lhcb", group="lhcb_user",
                lifetime=3600)
            with user:
                try:
                    yield ArcGrid(base, ctx, ces, Director(ctx, ces), PilotFollower(ctx, ces),
                                  user, url)
                finally:
                    end_pilots_at_the_ce(arc_ce, tmp_path, ctx, proxy=None if (
                        credential != "proxy") else proxy_file or arc_ce.proxy)
    finally:
        engine.dispose()


def end_pilots_at_the_ce(arc_ce: LocalCe, tmp_path: Path, ctx: AgentContext, *,
                         proxy: Path | None = None) -> None:
    """Kill and clean every CE job the test's director submitted, whether or not it ended:
    no pilot outlives its test (nor its matcher, which is stopped next). With a token of
    its own (the test's token file may hold a bad one), or with the ``proxy`` the pilots were
    submitted with: the CE shows a proxy's jobs to that identity only."""
    with ctx.factory() as session:
        ids = [p.native_id for p in session.scalars(select(Pilot)) if p.native_id]
    if not ids:
        return
    client = arc_ce.proxy_client(proxy, timeout=30) if proxy is not None else (
        arc_ce.token_client(write_secret(tmp_path / "cleanup.token", arc_ce.token()),
                            timeout=30))
    try:
        end_jobs(arc_ce, client, ids)
    finally:
        client.close()


def pilot_log_command(base: str, reference: str) -> subprocess.CompletedProcess[str]:
    """The installed ``gridpilot-client pilot-log``, as an operator runs it."""
    command = Path(sys.executable).parent / "gridpilot-client"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRIDPILOT_", "BEARER"))}
    return subprocess.run([str(command), "--url", base, "--token", operator_token(),
                           "pilot-log", reference], capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.mark.parametrize("credential", ["token", "proxy", "both"])
def test_a_job_runs_in_a_pilot_the_director_sent_through_arc(
        arc_ce: LocalCe, tmp_path: Path, credential: str) -> None:
    with arc_grid(arc_ce, tmp_path, credential) as grid:
        job_id = grid.submit("/bin/echo", f"hello from ARC with a {credential}")
        report = grid.director.cycle()
        assert report.submitted == {f"{SITE}/{CE}/{QUEUE}": 1}, report.line()
        pilot = grid.pilot()
        assert (pilot.executor, pilot.status) == ("arc", "Submitted")
        assert pilot.native_id and len(pilot.native_id) > 8

        grid.follow_until("the job is Done and the pilot's log kept", lambda: (
            grid.job(job_id)["status"] in ("Done", "Failed")
            and grid.pilot().log_state is not None))
        job = grid.job(job_id)
        assert (job["status"], job["exit_code"]) == ("Done", 0), job
        assert job["pilot_reference"] == pilot.reference
        output = grid.user.get(f"{grid.base}/api/v1/jobs/{job_id}/output", timeout=30).json()
        assert f"hello from ARC with a {credential}" in output["output_tail"]
        ended = grid.pilot()
        assert (ended.status, ended.exit_code, ended.log_state) == ("Done", 0, "stored"), (
            ended.status, ended.reason, ended.log_note)

        shown = pilot_log_command(grid.base, pilot.reference)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert shown.stdout.startswith(f"pilot {pilot.reference}: Done, exit code 0")
        assert "--- standard error" in shown.stdout
        # The pilot's own log lines: it matched the job and ran it.
        assert str(job_id) in shown.stdout.split("--- standard error", 1)[1]
        # The CE forgot the pilot once its log was kept.
        assert grid.arc().client.statuses([pilot.native_id]) == {pilot.native_id: UNKNOWN}


def test_an_operator_kills_a_pilot_through_arc_and_its_job_is_not_run_twice(
        arc_ce: LocalCe, tmp_path: Path) -> None:
    with arc_grid(arc_ce, tmp_path, "token") as grid:
        job_id = grid.submit("/bin/sleep", "600")
        grid.director.cycle()
        grid.follow_until("the job runs", lambda: grid.job(job_id)["status"] == "Running")
        reference = grid.pilot().reference
        answer = requests.post(f"{grid.base}/api/v1/pilots/{reference}/kill", timeout=30,
                               headers={"Authorization": f"Bearer {operator_token()}"})
        assert answer.status_code == 202, answer.text
        report = grid.follower.turn()
        assert report.killed == 1, report.line()
        assert grid.pilot().status == "Aborted"
        grid.follow_until("the CE says the pilot ended",
                          lambda: grid.pilot().log_state is not None)
        pilot = grid.pilot()
        assert pilot.status == "Aborted" and "olga" in pilot.reason
        # The job the pilot held is its own still: no other pilot got it (it is rescheduled
        # by the watchdog once it falls silent).
        job = grid.job(job_id)
        assert (job["status"], job["pilot_reference"]) == ("Running", reference)
        with grid.ctx.factory() as session:
            assert session.scalar(select(Job.reschedule_count).where(Job.id == job_id)) == 0


def test_the_director_asks_the_ce_for_all_its_pilots_at_once(
        arc_ce: LocalCe, tmp_path: Path) -> None:
    """Three pilots (stand-ins that speak to nobody), one status request per turn."""
    with arc_grid(arc_ce, tmp_path, "token", pilot_command=("/bin/sh", "-c", "sleep 2")) as g:
        for _ in range(3):
            g.submit("/bin/true", "")
        assert sum(g.director.cycle().submitted.values()) == 3
        seen: list[str] = []
        g.arc().client._session.hooks["response"].append(
            lambda r, *a, **k: seen.append(f"{r.request.method} {r.request.url}"))
        g.follower.turn()
        assert [s for s in seen if "action=status" in s] == [
            f"POST {g.arc().client.endpoint}/rest/1.0/jobs?action=status"], seen
        ids = [str(p.native_id) for p in _pilots(g)]
        wait_for_states(g.arc().client, ids, lambda s: s == "FINISHED", timeout=PATIENCE)
        # Their ends in one turn: their states, then their exit codes, in one request each;
        # their two streams; one request for the CE to forget them all.
        seen.clear()
        report = g.follower.turn()
        assert report.logs == 3, report.line()
        assert {(p.status, p.exit_code, p.log_state) for p in _pilots(g)} == {
            ("Done", 0, "stored")}
        assert len(seen) <= 2 + 2 * 3 + 1, seen
        assert len([s for s in seen if "action=clean" in s]) == 1, seen


def _pilots(grid: ArcGrid) -> list[Pilot]:
    with grid.ctx.factory() as session:
        rows = list(session.scalars(select(Pilot)))
        session.expunge_all()
        return rows


def arc_localhost(action: str) -> None:
    done = subprocess.run([str(ROOT / "tools" / "arc-localhost"), action], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"arc-localhost {action}: {done.stdout}{done.stderr}"


def test_a_ce_down_while_its_pilot_runs_is_followed_again_once_back(
        arc_ce: LocalCe, tmp_path: Path) -> None:
    with arc_grid(arc_ce, tmp_path, "token", failure_backoff=1) as grid:
        job_id = grid.submit("/bin/sleep", "20")
        grid.director.cycle()
        grid.follow_until("the job runs", lambda: grid.job(job_id)["status"] == "Running")
        reference = grid.pilot().reference
        arc_localhost("down")
        try:
            report = grid.follower.turn()
            (failure,) = report.failed.values()
            assert "failure 1 in a row" in failure, report.line()
            # The record stays as it was; the queue shows the CE's failure.
            assert grid.pilot().status == "Running"
            again = grid.director.cycle()
            assert f"{SITE}/{CE}/{QUEUE}" in again.skipped, again.line()
            # The pilot goes on without its CE: it reports the job to the matcher itself.
            deadline = time.monotonic() + PATIENCE
            while grid.job(job_id)["status"] != "Done":
                assert time.monotonic() < deadline, grid.job(job_id)
                time.sleep(1)
        finally:
            arc_localhost("up")
        time.sleep(1.5)  # the back-off (1 s, doubled once) is over
        grid.follow_until("the CE's word on the pilot is back", lambda: (
            grid.pilot().log_state is not None), allow_failures=True)
        pilot = grid.pilot()
        assert (pilot.reference, pilot.status, pilot.log_state) == (reference, "Done",
                                                                    "stored")
        # The job ran once, in that pilot.
        job = grid.job(job_id)
        assert (job["status"], job["pilot_reference"]) == ("Done", reference)
        assert [h["status"] for h in job["history"]].count("Running") == 1, job["history"]


def test_a_token_the_ce_refuses_fails_the_submission_naming_the_ce_and_the_file(
        arc_ce: LocalCe, tmp_path: Path) -> None:
    with arc_grid(arc_ce, tmp_path, "token", pilot_command=("/bin/true",)) as grid:
        token_file = tmp_path / "ce.token"
        for bad in (arc_ce.token(lifetime=-60), arc_ce.token(audience="https://elsewhere")):
            write_secret(token_file, bad)
            grid.submit("/bin/true", "")
            report = grid.director.cycle()
            (reason,) = report.failed.values()
            assert arc_ce.host_port in reason and str(token_file) in reason, reason
            # The pilots never reached the CE: no record of them; the queue keeps the reason
            # and counts them.
            assert _pilots(grid) == []
            with grid.ctx.factory() as session:
                state = session.get(DirectorQueue, next(iter(report.failed)).split("/"))
                assert state is not None and state.unsent_pilots >= 1
                assert str(token_file) in state.last_error
                session.execute(Pilot.__table__.delete())
                session.execute(DirectorQueue.__table__.delete())
                session.commit()
        # A good token again (the file is read again when it changes): pilots go, one for
        # each of the two jobs waiting.
        write_secret(token_file, arc_ce.token())
        assert sum(grid.director.cycle().submitted.values()) == 2


def test_a_pilot_the_ce_runs_and_that_fails_says_why(arc_ce: LocalCe, tmp_path: Path) -> None:
    with arc_grid(arc_ce, tmp_path, "token", pilot_command=(
            "/bin/sh", "-c", "echo 'gridpilot-pilot: exit 3: the stand-in gives up' >&2; "
                             "exit 3")) as grid:
        grid.submit("/bin/true", "")
        grid.director.cycle()
        grid.follow_until("the pilot ended", lambda: grid.pilot().log_state is not None)
        pilot = grid.pilot()
        assert (pilot.status, pilot.exit_code) == ("Failed", 3), (pilot.status, pilot.reason)
        assert pilot.reason == "exit code 3: gridpilot-pilot: exit 3: the stand-in gives up"


def test_a_pilot_the_ce_lost_is_lost_and_never_counted_as_running(
        arc_ce: LocalCe, tmp_path: Path) -> None:
    with arc_grid(arc_ce, tmp_path, "token", pilot_command=("/bin/sh", "-c", "sleep 600")
                  ) as grid:
        grid.submit("/bin/true", "")
        grid.director.cycle()
        pilot = grid.pilot()
        assert pilot.native_id
        # The CE forgets the job behind the director's back (an operator of the site wiped
        # it, the CE was reinstalled ...).
        client = grid.arc().client
        client.kill([pilot.native_id])
        deadline = time.monotonic() + PATIENCE
        # The CE takes a clean request and carries it out later.
        while client.statuses([pilot.native_id])[pilot.native_id] != UNKNOWN:
            assert time.monotonic() < deadline, "the CE did not forget the job"
            client.clean([pilot.native_id])
            time.sleep(2)
        report = grid.follower.turn()
        assert not report.failed, report.line()
        lost = grid.pilot()
        assert lost.status == "Lost" and "does not know it" in lost.reason
        assert lost.log_state == "unavailable"
        # Not counted as running: the director sends a new pilot for the job still waiting.
        assert sum(grid.director.cycle().submitted.values()) == 1


#: The ended pilots of one poll in the bulk test below.
ENDED = 20


def test_the_end_of_many_pilots_costs_a_few_requests_and_two_per_pilot(
        arc_ce: LocalCe, tmp_path: Path) -> None:
    """Issue 34 item 1: the states of 20 ended pilots (their exit codes and the CE's reasons
    with them) in at most 3 requests; their outputs in at most two requests each (one per
    stream); the CE forgets them all in one request."""
    token = write_secret(tmp_path / "ce.token", arc_ce.token())
    ce = ArcCE(CEConfig("arc", "arc", endpoint=arc_ce.endpoint, token_file=str(token),
                        ca_bundle=str(arc_ce.ca_bundle)), timeout=60)
    specs = [PilotSpec(f"bulk-{i}", "/bin/sh", ["-c", (
        f"echo 'out of pilot-{i}'; echo 'gridpilot-pilot: exit {i % 4}: the stand-in gives up' "
        f">&2; exit {i % 4}")], {}, token=f"token-{i}", queue_name=QUEUE, wall_minutes=10)
        for i in range(ENDED)]
    ids = ce.submit(specs)
    assert all(isinstance(i, str) for i in ids), ids
    pilots = [CEPilot(s.reference, str(i)) for s, i in zip(specs, ids, strict=True)]
    try:
        wait_for_states(ce.client, [str(i) for i in ids], lambda s: s in ("FINISHED", "FAILED"),
                        timeout=PATIENCE)
        seen: list[str] = []
        ce.client._session.hooks["response"].append(
            lambda r, *a, **k: seen.append(f"{r.request.method} {r.request.url}"))
        states = ce.states(pilots)
        assert len(seen) <= 3, seen
        for i, p in enumerate(pilots):
            state = states[p.reference]
            assert state.exit_code == i % 4, (p.reference, state)
            if i % 4:
                assert (state.status, state.reason) == (
                    "Failed", f"LRMS error: ({i % 4}) Job finished with wrong exit code - "
                              f"{i % 4} != 0"), state
            else:
                assert (state.status, state.reason) == ("Done", ""), state

        seen.clear()
        outputs = ce.outputs(pilots, 1024)
        assert len(seen) <= 2 * ENDED, seen
        for i, p in enumerate(pilots):
            output = outputs[p.reference]
            assert isinstance(output, PilotOutput), output
            assert output.stdout == f"out of pilot-{i}\n".encode()
            assert output.stderr == (f"gridpilot-pilot: exit {i % 4}: the stand-in gives up\n"
                                     .encode())
            assert not output.truncated
        # The end of a stream longer than the limit: its last bytes, and it says so.
        cut = ce.outputs(pilots[:1], 5)[pilots[0].reference]
        assert isinstance(cut, PilotOutput)
        assert (cut.stdout, cut.stderr, cut.truncated) == (b"ot-0\n", b"s up\n", True)

        seen.clear()
        ce.clean(pilots)
        assert len(seen) == 1, seen
        # The CE carries a clean request out a little later.
        wait_for_states(ce.client, [str(i) for i in ids], lambda s: s == UNKNOWN)
    finally:
        end_jobs(arc_ce, ce.client, [str(i) for i in ids])
        ce.client.close()


def _ask_ce(arc_ce: LocalCe, proxy: Path, method: str, path: str,
            **kwargs: Any) -> requests.Response:
    """A request of the test's own to the CE, with the proxy's identity."""
    return requests.request(method, f"{arc_ce.endpoint}/rest/1.0/{path}", cert=str(proxy),
                            verify=str(arc_ce.ca_bundle), timeout=30,
                            headers={"Accept": "application/json"}, **kwargs)


def _delegations_held(arc_ce: LocalCe, proxy: Path) -> dict[str, int]:
    """The delegations the CE holds for the proxy's identity, and the serial numbers of their
    certificates (REST: action=get)."""
    listed = _ask_ce(arc_ce, proxy, "GET", "delegations")
    entries = listed.json()["delegation"] if listed.content.strip() else []
    held: dict[str, int] = {}
    for entry in entries if isinstance(entries, list) else [entries]:
        got = _ask_ce(arc_ce, proxy, "POST", f"delegations/{entry['id']}",
                      params={"action": "get"})
        certificates = x509.load_pem_x509_certificates(got.content) if got.content.strip() \
            else []
        held[entry["id"]] = certificates[0].serial_number if certificates else 0
    return held


def test_the_pilots_loop_renews_a_delegation_while_nothing_is_submitted(
        arc_ce: LocalCe, tmp_path: Path) -> None:
    # A proxy of half an hour: the delegation is due for renewal whenever it is looked at.
    proxy = tmp_path / "proxy.pem"
    proxy.write_bytes(make_proxy(load_credential(arc_ce.user_cert, arc_ce.user_key),
                                 lifetime=timedelta(minutes=30)))
    proxy.chmod(0o600)
    for delegation in _delegations_held(arc_ce, proxy):  # other tests' (of the same user)
        _ask_ce(arc_ce, proxy, "POST", f"delegations/{delegation}", params={"action": "delete"})
    with arc_grid(arc_ce, tmp_path, "proxy", proxy_file=proxy,
                  pilot_command=("/bin/sleep", "60")) as grid:
        grid.submit("/bin/true", "")
        assert sum(grid.director.cycle().submitted.values()) == 1
        [(delegation, serial)] = _delegations_held(arc_ce, proxy).items()
        # No submission since: the pilots loop, following the pilot, renews it.
        report = grid.follower.turn()
        assert not report.failed, report.line()
        assert _delegations_held(arc_ce, proxy).keys() == {delegation}
        assert _delegations_held(arc_ce, proxy)[delegation] != serial


def held_jobs(client: ArcRestClient, n: int) -> list[str]:
    """``n`` jobs of another user of the CE that wait for an input file never uploaded: the
    CE counts them waiting in its queue until they are cleaned."""
    description = adl.job_description(
        "/bin/true", [], name="held-by-another-user", queue=QUEUE, cores=1, memory_mb=None,
        wall_minutes=5, environment={}, input_files=["never-uploaded"], stdout="out",
        stderr="err")
    ids = [r for r in client.submit([description] * n) if isinstance(r, str)]
    assert len(ids) == n
    return ids


def wait_for_load(client: ArcRestClient, what: str, check: Callable[[CELoad], bool]
                  ) -> CELoad:
    """The CE's load of the queue once its information provider shows ``check`` true."""
    deadline = time.monotonic() + PATIENCE
    while True:
        load = client.info().loads.of(QUEUE)
        assert load is not None, "the CE publishes no load of its queue"
        if check(load):
            return load
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until the CE says {what}: {load.line()}")
        time.sleep(2)


def test_the_director_sends_no_pilot_to_a_ce_that_says_its_queue_is_full(
        arc_ce: LocalCe, tmp_path: Path) -> None:
    """Issue 34 item 9: the CE's own waiting count (all its users') against the queue's
    MaxWaitingPilots, read from A-REX's GLUE2 information, stored for the sites page."""
    name = f"{SITE}/{CE}/{QUEUE}"
    other = arc_ce.token_client(write_secret(tmp_path / "other.token", arc_ce.token()),
                                timeout=30)
    held: list[str] = []
    try:
        with arc_grid(arc_ce, tmp_path, "token", queue_lines="MaxWaitingPilots = 2\n",
                      ce_info_period=1) as grid:
            held = held_jobs(other, 2)
            wait_for_load(other, "2 jobs wait", lambda load: load.waiting >= 2)
            grid.submit("/bin/echo", "waits for room at the CE")
            report = grid.director.cycle()
            assert report.submitted.get(name, 0) == 0, report.line()
            why = report.skipped[name]
            assert "its CE says it is full" in why and "MaxWaitingPilots is 2" in why, why
            with grid.ctx.factory() as session:
                assert session.scalars(select(Pilot)).all() == []
                state = session.get(DirectorQueue, (SITE, CE, QUEUE))
                assert state is not None and state.ce_read_at is not None
                assert state.ce_waiting is not None and state.ce_waiting >= 2
                assert state.ce_running == 0 and state.ce_idle_since is not None
                assert state.ce_error == ""

            end_jobs(arc_ce, other, held)
            held = []
            wait_for_load(other, "fewer than 2 jobs wait", lambda load: load.waiting < 2)
            time.sleep(1)  # past ce_info_period: the director reads the CE again
            report = grid.director.cycle()
            assert report.submitted == {name: 1}, report.line()
            with grid.ctx.factory() as session:
                state = session.get(DirectorQueue, (SITE, CE, QUEUE))
                assert state is not None and state.ce_waiting is not None
                assert state.ce_waiting < 2
    finally:
        if held:
            end_jobs(arc_ce, other, held)
        other.close()



@pytest.mark.parametrize(("credential", "delegated"), [
    ("token", False), ("proxy", True), ("both", True)])
def test_a_pilot_gets_a_delegated_proxy_with_a_proxy_or_both_and_none_with_a_token(
        arc_ce: LocalCe, tmp_path: Path, credential: str, delegated: bool) -> None:
    """A-REX gives a job the proxy of the delegation its description names, in the file
    $X509_USER_PROXY names (it names one that does not exist when there is none): in mode
    "both" the pilot was submitted with the token (it is the token's job: the proxy's
    identity does not see it) and still has the proxy. The pilot here is a shell that shows
    the head of that file."""
    show = "printenv X509_USER_PROXY | xargs -r head -c 27 | grep BEGIN || echo no proxy"
    with arc_grid(arc_ce, tmp_path, credential,
                  pilot_command=("/bin/sh", "-c", show, "pilot")) as grid:
        grid.submit("/bin/true", "")
        report = grid.director.cycle()
        assert sum(report.submitted.values()) == 1, report.line()
        pilot = grid.pilot()
        client = grid.arc().client
        assert client.credentials == credential
        if credential == "both":
            mine = client.delegations()
            assert len(mine) == 1
            proxy_identity = arc_ce.proxy_client(timeout=30)
            try:
                assert pilot.native_id not in proxy_identity.statuses(None)
                assert mine[0] not in proxy_identity.delegations()
            finally:
                proxy_identity.close()
        grid.follow_until("the pilot's log is kept", lambda: grid.pilot().log_state
                          is not None, allow_failures=True)
        shown = pilot_log_command(grid.base, pilot.reference)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        stdout = shown.stdout.split("--- standard error", 1)[0]
        if delegated:
            assert "-----BEGIN CERTIFICATE-----" in stdout, shown.stdout
        else:
            assert "no proxy" in stdout and "CERTIFICATE" not in stdout, shown.stdout

def _serial(arc_ce: LocalCe, auth: dict[str, Any], delegation: str) -> int:
    """The serial number of a delegation's certificate, asked with ``auth``'s identity."""
    got = requests.post(f"{arc_ce.endpoint}/rest/1.0/delegations/{delegation}",
                        params={"action": "get"}, verify=str(arc_ce.ca_bundle), timeout=30,
                        **auth)
    assert got.status_code == 200, got.reason
    return int(x509.load_pem_x509_certificates(got.content)[0].serial_number)


@pytest.mark.parametrize("credential", ["proxy", "both"])
def test_a_renewed_proxy_file_renews_the_delegation_at_the_next_keep(
        arc_ce: LocalCe, tmp_path: Path, credential: str) -> None:
    user = load_credential(arc_ce.user_cert, arc_ce.user_key)
    proxy = write_secret(tmp_path / "proxy.pem",
                         make_proxy(user, lifetime=timedelta(hours=12)).decode())
    token = write_secret(tmp_path / "ce.token", arc_ce.token())
    files: dict[str, Path] = {"proxy_file": proxy}
    auth: dict[str, Any] = {"cert": str(proxy)}
    if credential == "both":
        files["token_file"] = token
        auth = {"headers": {"Authorization": f"Bearer {token.read_text().strip()}"}}
    client = ArcRestClient(arc_ce.endpoint, ca_bundle=arc_ce.ca_bundle, timeout=30,
                           **files)  # type: ignore[arg-type]
    try:
        for old in client.delegations():  # other tests' of the same identity
            requests.post(f"{arc_ce.endpoint}/rest/1.0/delegations/{old}",
                          params={"action": "delete"}, verify=str(arc_ce.ca_bundle),
                          timeout=30, **auth)
        delegation = client.keep_delegation()
        assert delegation is not None
        first = _serial(arc_ce, auth, delegation)
        # Far from its end, and the proxy unchanged: nothing is renewed.
        assert client.keep_delegation() == delegation
        assert _serial(arc_ce, auth, delegation) == first
        # A refresher writes a new proxy: the next keep renews the delegation from it.
        write_secret(proxy, make_proxy(user, lifetime=timedelta(hours=12)).decode())
        assert client.keep_delegation() == delegation
        assert client.delegations() == [delegation]
        renewed = x509.load_pem_x509_certificates(requests.post(
            f"{arc_ce.endpoint}/rest/1.0/delegations/{delegation}", params={"action": "get"},
            verify=str(arc_ce.ca_bundle), timeout=30, **auth).content)
        assert renewed[0].serial_number != first
        # Signed by the new proxy: its issuer is the new proxy's subject.
        new_proxy = x509.load_pem_x509_certificates(proxy.read_bytes())[0]
        assert renewed[0].issuer == new_proxy.subject
    finally:
        # The user's other tests adopt a delegation left on the CE: none is left.
        for left in client.delegations():
            requests.post(f"{arc_ce.endpoint}/rest/1.0/delegations/{left}",
                          params={"action": "delete"}, verify=str(arc_ce.ca_bundle),
                          timeout=30, **auth)
        client.close()


def test_a_token_near_its_end_is_warned_about_until_its_file_is_replaced(
        arc_ce: LocalCe, tmp_path: Path) -> None:
    name = f"{SITE}/{CE}/{QUEUE}"
    with arc_grid(arc_ce, tmp_path, "token", pilot_command=("/bin/true",)) as grid:
        # Four minutes left: under five. It still works, and the pilot goes.
        write_secret(tmp_path / "ce.token", arc_ce.token(lifetime=240))
        grid.submit("/bin/true", "")
        report = grid.director.cycle()
        assert sum(report.submitted.values()) == 1, report.line()
        assert report.warned[name].startswith(
            f"the token in {tmp_path / 'ce.token'} is near its end: it expires at "), report
        with grid.ctx.factory() as session:
            (row,) = session.scalars(select(DirectorQueue)).all()
            assert "near its end" in row.credential_warning
        # A refresher replaces it: the warning goes at the next cycle.
        write_secret(tmp_path / "ce.token", arc_ce.token(lifetime=3600))
        assert name not in grid.director.cycle().warned
        with grid.ctx.factory() as session:
            (row,) = session.scalars(select(DirectorQueue)).all()
            assert row.credential_warning == ""
