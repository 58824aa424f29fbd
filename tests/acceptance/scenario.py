"""The acceptance scenario: the whole grid as a VO deploys and uses it (``make acceptance``).

It deploys the grid the way docs/operations.md tells an operator (tests/acceptance/deploy.py:
the central service through tools/topology, a site behind the local ARC-CE with a token, a
site behind the local Slurm, a replica at one site's storage element), then acts on it only
as its people do, through ``gridpilot-client`` and the public https URL with what
``tools/topology env`` exports:

- users submit DIRAC JDLs as they write them (``Executable = "run.sh"`` shipped in the
  InputSandbox, a parametric JDL, InputData, a multi-core job, a job that fails, a long job, an
  OutputSandbox), peek, kill, reschedule, fetch output and ask ``explain``;
- the operator bans a site and lifts the ban, kills a pilot on each kind of CE, reads pilot logs;
- faults: a matcher instance is killed (and Prometheus must raise, then clear, its alert),
  PgBouncer restarts, A-REX stops for 30 s; with ``--ha`` (``make acceptance-ha``) the
  database is the highly available one of ``tools/pg-ha`` (PgBouncer in front of its
  HAProxy), and its primary is switched over to the standby while pilots run.

Then it checks the end state and prints a table: every job in the final state it should have
(none lost, none run more often than it was rescheduled, none matched to a pilot after that
pilot's kill), ``explain`` agreeing with where each job ran, each ended pilot's log
retrievable, the OutputSandbox fetched, the alert fired and cleared; and what each fault cost.
Exit 0 only when every check holds. It cleans up everything it started, also when
interrupted. Its figures go to ``work/artifacts/acceptance/report.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import requests

from tests.acceptance.deploy import (
    ARC_QUEUE,
    ARC_SE,
    ARC_SITE,
    HERE,
    ROOT,
    SLURM_QUEUE,
    SLURM_SITE,
    DeployError,
    Grid,
    Log,
    run_tool,
    stop_on_signals,
)

T = TypeVar("T")
FINAL = ("Done", "Failed", "Killed", "Deleted")
PILOT_ENDED = ("Done", "Failed", "Aborted", "Lost")
CLIENT = Path(sys.executable).parent / "gridpilot-client"
#: The whole scenario's budget on a two-core machine, deployment included.
BUDGET = 12 * 60
LFN = "LFN:/lhcb/acceptance/run1/data.raw"


class ScenarioError(Exception):
    """Something the scenario waited for did not happen; the message says what."""


@dataclass
class Expected:
    """One job of the workload and what should become of it."""

    label: str
    job_id: int
    status: str
    #: The site it must run at (None: any).
    site: str | None = None
    #: How often it should run (a pilot starting it: Matched, then Running): once, plus once
    #: per reschedule the scenario causes. It may be matched more often: a match its pilot
    #: never confirms (the answer lost to a fault, a kill landing meanwhile) goes back to its
    #: queue without a run.
    runs: int = 1


@dataclass
class Fault:
    name: str
    #: Seconds since the scenario's start, and the wall clock at its start.
    started: float
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
    ended: float = 0.0
    ended_at: datetime | None = None

    def end(self, elapsed: float) -> None:
        self.ended, self.ended_at = elapsed, datetime.now(UTC)


@dataclass
class Report:
    jobs: list[dict[str, Any]] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)

    def check(self, name: str, ok: bool) -> None:
        self.checks[name] = self.checks.get(name, True) and ok


class Client:
    """``gridpilot-client`` as a person runs it, with nothing but what ``tools/topology env``
    exports (and the operator's token file for the operator)."""

    def __init__(self, grid: Grid, work: Path, *, operator: bool = False) -> None:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GRIDPILOT_", "BEARER_", "REQUESTS_CA", "X509_"))}
        env.update(grid.client)
        if operator:
            env["GRIDPILOT_TOKEN_FILE"] = grid.client["GRIDPILOT_OPERATOR_TOKEN_FILE"]
        self.env = env
        self.work = work

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(CLIENT), *args], capture_output=True, text=True,
                              timeout=120, env=self.env, cwd=self.work,
                              stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise ScenarioError(f"gridpilot-client {' '.join(args)} exited "
                                f"{done.returncode}: {done.stderr.strip()[-1500:]}")
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json").stdout)


class Api:
    """The HTTP API for what the client has no command for (the site mask, the replica
    catalogue, the pilots' list), as the operator's scripts or the dashboard call it."""

    def __init__(self, grid: Grid, token_file: str) -> None:
        self.url = grid.url + "/api/v1"
        self.http = requests.Session()
        self.http.verify = grid.ca
        self.http.trust_env = False
        self.http.headers["Authorization"] = "Bearer " + Path(token_file).read_text().strip()

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call; a read answered 503 or 429 with ``Retry-After`` is sent again when told
        (for up to 30 s), as ``gridpilot-client`` does: a database failing over makes every
        matcher instance unavailable for seconds."""
        give_up = time.monotonic() + 30
        while True:
            answer = self.http.request(method, self.url + path, timeout=30, **kwargs)
            wait = answer.headers.get("Retry-After", "")
            if method != "GET" or answer.status_code not in (429, 503) \
                    or not wait.isdigit() or time.monotonic() + int(wait) > give_up:
                break
            time.sleep(int(wait))
        if answer.status_code >= 400:
            raise ScenarioError(f"{method} {path}: {answer.status_code} {answer.text[:300]}")
        return answer.json() if answer.content else None

    def pilots(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        after: Any = None
        while True:
            page = self.call("GET", "/pilots", params={"limit": 500, **(
                {"after": after} if after is not None else {})})
            out += page["pilots"]
            after = page.get("next_after")
            if after is None:
                return out


class Probe(threading.Thread):
    """A user's request every quarter second through the public URL, all the scenario long:
    what the faults cost, seen from outside."""

    def __init__(self, api: Api, log: Log) -> None:
        super().__init__(daemon=True, name="probe")
        self.api, self.log = api, log
        self.stopping = threading.Event()
        #: (seconds since the start, HTTP status or 0 for no answer, Retry-After given)
        self.seen: list[tuple[float, int, bool]] = []

    def run(self) -> None:
        while not self.stopping.wait(0.25):
            at = self.log.elapsed()
            try:
                answer = self.api.http.get(self.api.url + "/jobs/summary", timeout=10)
                self.seen.append((at, answer.status_code, "Retry-After" in answer.headers))
            except requests.RequestException:
                self.seen.append((at, 0, False))

    def failures(self, windows: Sequence[tuple[float, float]]) -> dict[str, Any]:
        """What the prober saw in the windows (seconds since the start)."""
        def inside(t: float) -> bool:
            return any(start <= t <= end for start, end in windows)

        bad = [(t, s, r) for t, s, r in self.seen if inside(t) and s != 200]
        return {"requests": sum(1 for t, _s, _r in self.seen if inside(t)),
                "failed": len(bad), "statuses": sorted({s for _t, s, _r in bad}),
                "without_retry_after": sum(1 for _t, s, r in bad if s in (503, 429) and not r),
                "seconds": round(bad[-1][0] - bad[0][0], 2) if bad else 0.0}


class Scenario:
    def __init__(self, grid: Grid, work: Path, log: Log) -> None:
        self.grid, self.work, self.log = grid, work, log
        self.user = Client(grid, work)
        self.operator = Client(grid, work, operator=True)
        self.api = Api(grid, grid.client["GRIDPILOT_OPERATOR_TOKEN_FILE"])
        self.probe = Probe(Api(grid, grid.client["GRIDPILOT_TOKEN_FILE"]), log)
        self.expected: dict[str, Expected] = {}
        self.faults: list[Fault] = []
        self.report = Report()
        #: Killed pilots: reference → wall-clock time of the kill (UTC).
        self.killed_pilots: dict[str, datetime] = {}
        self.killed_pilot_jobs: dict[str, int] = {}
        #: The jobs each killed pilot held or had run when it was killed.
        self.held_at_kill: dict[str, set[int]] = {}
        #: Jobs seen back with a killed pilot, matched again after its kill.
        self.back_to_killed: set[int] = set()
        #: Seconds from each pilot's kill to its record's end, as far as watched.
        self.kill_to_end: dict[str, float] = {}

    # -- helpers -----------------------------------------------------------------------------

    def wait(self, what: str, check: Callable[[], T | None], timeout: float,
             interval: float = 1.0) -> T:
        deadline = time.monotonic() + min(timeout, BUDGET - self.log.elapsed())
        while True:
            found = check()
            if found:
                return found
            if time.monotonic() > deadline:
                raise ScenarioError(f"{what} did not happen within {timeout:g} s")
            time.sleep(interval)

    def job(self, job_id: int) -> dict[str, Any]:
        data: dict[str, Any] = self.user.json("log", str(job_id))
        return data

    def submit(self, label: str, text: str, *, status: str = "Done", site: str | None = None,
               runs: int = 1, name: str | None = None) -> list[int]:
        path = self.work / (name or f"{label}.jdl")
        if not path.exists():
            path.write_text(text, encoding="utf-8")
        answer = self.user.json("submit", path.name)
        ids = [int(j["job_id"]) for j in answer["jobs"]]
        for i, job_id in enumerate(ids):
            key = label if len(ids) == 1 else f"{label}[{i}]"
            self.expected[key] = Expected(key, job_id, status, site, runs)
        self.log(f"submitted {label}: job(s) {', '.join(map(str, ids))}"
                 + (f"; warnings: {answer['warnings']}" if answer.get("warnings") else ""))
        return ids

    def status_of(self, job_id: int, *wanted: str) -> dict[str, Any] | None:
        job = self.job(job_id)
        return job if job["status"] in wanted else None

    def fault(self, name: str) -> Fault:
        fault = Fault(name, self.log.elapsed())
        self.faults.append(fault)
        self.log(f"fault: {name}")
        return fault

    # -- the scenario --------------------------------------------------------------------------

    def run(self) -> Report:
        self.probe.start()
        try:
            self._workload()
            self._users_and_operators()
            self._end_state()
        finally:
            self.probe.stopping.set()
            self.probe.join(timeout=15)
        self._faults_cost()
        return self.report

    def _workload(self) -> None:
        for name in ("hello.jdl", "run.sh", "parametric.jdl", "failing.jdl", "long.jdl",
                     "short.jdl"):
            shutil.copy(HERE / "jobs" / name, self.work / name)
        # The operator: a replica at the ARC site's storage element, and the Slurm site banned
        # while its first jobs arrive.
        self.api.call("POST", "/replicas", json={"replicas": [{"lfn": LFN, "se": ARC_SE}]})
        self.api.call("PUT", f"/sitemask/{SLURM_SITE}",
                      json={"reason": "acceptance: banned while its jobs arrive"})
        self.banned_at = self.log.elapsed()
        self.submit("hello", "", name="hello.jdl")
        self.submit("param", "", name="parametric.jdl")
        self.submit("inputdata", f'[ JobName = "acceptance-inputdata"; Executable = "/bin/sh";'
                    f' Arguments = "-c \'echo reading data\'"; CPUTime = 600;'
                    f' InputData = {{"{LFN}"}}; ]', site=ARC_SITE)
        self.submit("multicore", '[ JobName = "acceptance-multicore"; Executable = "/bin/sh";'
                    ' Arguments = "-c \'echo cores: $(nproc)\'"; CPUTime = 600;'
                    ' NumberOfProcessors = 2; ]', site=SLURM_SITE)
        self.submit("failing", "", status="Failed", name="failing.jdl")
        self.submit("long", "", status="Killed", name="long.jdl")
        for site, label in ((ARC_SITE, "pilotkill-arc"), (SLURM_SITE, "pilotkill-slurm")):
            self.submit(label, f'[ JobName = "acceptance-{label}"; Executable = "/bin/sh";'
                        f' Arguments = "-c \'echo started; sleep 40; echo finished\'";'
                        f' CPUTime = 600; Site = "{site}"; ]', site=site, runs=2)
        self.submit("reschedule", "", runs=2, name="short.jdl")
        self.matcher_fault = self.fault("matcher-2 killed")
        self.grid.topology("kill", "matcher-2")

    def _users_and_operators(self) -> None:
        e = self.expected
        # The ban holds: the multi-core job (only the Slurm queue has two cores) waits, and
        # explain says why; then the ban is lifted.
        self.wait("the ARC site's first job running", lambda: any(
            self.status_of(x.job_id, "Running", "Done") for x in e.values()
            if x.site == ARC_SITE), 240, 3)
        multicore = self.job(e["multicore"].job_id)
        self.report.check("ban: the banned site's job waits", multicore["status"] == "Waiting")
        explained = self.user.run("explain", str(e["multicore"].job_id), "--queue",
                                  SLURM_QUEUE, "--json", check=False)
        self.report.check("ban: explain says the site is banned",
                          explained.returncode == 5 and "ban" in explained.stdout.lower())
        self.api.call("DELETE", f"/sitemask/{SLURM_SITE}")
        self.log(f"ban lifted after {self.log.elapsed() - self.banned_at:.0f} s")

        # A user peeks at the long job and kills it.
        long_id = e["long"].job_id
        self.wait("the long job running", lambda: self.status_of(long_id, "Running"), 240, 2)
        peeked = self.wait("peek showing the long job's output",
                           lambda: self._peek(long_id, "long job started"), 150, 5)
        self.report.check("peek shows a running job's output", "long job started" in peeked)
        self.user.run("kill", str(long_id), "--reason", "acceptance: the user kills it")
        self.log(f"long job {long_id} killed by its owner")

        # The operator kills the pilot of a running job on each kind of CE; PgBouncer
        # restarts after the first, A-REX stops for 30 s after the second.
        for label in ("pilotkill-arc", "pilotkill-slurm"):
            job_id = e[label].job_id
            running = self.wait(f"{label} running", self._running(job_id), 300, 2)
            reference = running["pilot_reference"]
            self.held_at_kill[reference] = self._pilot_jobs(reference)
            self.operator.run("pilot-kill", reference)
            self.killed_pilots[reference] = datetime.now(UTC)
            self.killed_pilot_jobs[reference] = job_id
            self.log(f"operator killed pilot {reference} running job {job_id} ({label})")
            if label == "pilotkill-arc":
                fault = self.fault("PgBouncer restarted")
                self.grid.topology("restart", "pgbouncer")
                fault.end(self.log.elapsed())
            elif self.grid.ha:
                # Past the window in which the probe's failures count for PgBouncer's restart.
                time.sleep(max(0.0, self.faults[-1].ended + 16 - self.log.elapsed()))
                fault = self.fault("the database primary switched over")
                new = run_tool("pg-ha", "switchover", timeout=120).strip()
                fault.end(self.log.elapsed())
                self.log(f"the database primary is now {new}")
                # What follows changes things (a submission): as a careful user, once the
                # service answers again (a read waits out its 503s).
                self.api.call("GET", "/jobs/summary")
        self._watch_killed(30)
        fault = self.fault("A-REX stopped for 30 s")
        run_tool("arc-localhost", "down")
        try:
            # Work for the ARC site arrives while its CE is down: it runs once the CE is back.
            self.submit("during-arex-stop", f'[ JobName = "acceptance-during-arex-stop";'
                        f' Executable = "/bin/echo"; Arguments = "after the outage";'
                        f' CPUTime = 600; Site = "{ARC_SITE}"; ]', site=ARC_SITE)
            time.sleep(30)
        finally:  # interrupted or not, the CE is left running as it was found
            run_tool("arc-localhost", "up")
        fault.end(self.log.elapsed())
        self.arex_fault = fault

        # A user reschedules a job that ended.
        rid = e["reschedule"].job_id
        self.wait("the job to reschedule Done", lambda: self.status_of(rid, "Done"), 300, 3)
        self.user.run("reschedule", str(rid), "--reason", "acceptance: run it again")
        self.log(f"job {rid} rescheduled by its owner")

        # The killed matcher's alert fires; the instance comes back; the alert clears.
        fired = self.wait("the GridpilotMatcherDown alert firing", lambda: self._alert(
            "firing"), 300, 5)
        self.report.figures["alert_fired_after_s"] = round(
            self.log.elapsed() - self.matcher_fault.started, 1)
        self.log(f"alert fired: {fired['annotations'].get('summary', '')}")
        self.grid.topology("start", "matcher-2")
        self.matcher_fault.end(self.log.elapsed())
        cleared = self.wait("the GridpilotMatcherDown alert clearing",
                            lambda: not self._alert(None), 120, 2)
        self.report.figures["alert_cleared_after_restart_s"] = round(
            self.log.elapsed() - self.matcher_fault.ended, 1)
        self.report.check("the killed matcher's alert fired and cleared",
                          fired["state"] == "firing" and cleared)

    def _peek(self, job_id: int, text: str) -> str | None:
        out = self.user.run("peek", str(job_id), check=False).stdout
        return out if text in out else None

    def _running(self, job_id: int) -> Callable[[], dict[str, Any] | None]:
        return lambda: self.status_of(job_id, "Running")

    def _pilot_jobs(self, reference: str) -> set[int]:
        return {int(j["job_id"]) for j in self.api.call("GET", f"/pilots/{reference}")["jobs"]}

    def _watch_killed(self, seconds: float) -> None:
        """Look at the killed pilots' jobs for a while: none may be matched to its killed
        pilot again (the job seen with that pilot, its last match after the kill)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for reference, job_id in self.killed_pilot_jobs.items():
                job = self.job(job_id)
                if job.get("pilot_reference") == reference and self._matched_after_kill(
                        job, reference):
                    self.back_to_killed.add(job_id)
                pilot = self.api.call("GET", f"/pilots/{reference}")
                if pilot["status"] in PILOT_ENDED and reference not in self.kill_to_end:
                    self.kill_to_end[reference] = round((datetime.now(UTC) - self.killed_pilots[
                        reference]).total_seconds(), 1)
            time.sleep(2)

    def _alert(self, state: str | None) -> dict[str, Any] | None:
        port = json.loads(self.grid.topology("status"))["ports"]["prometheus"]
        answer = requests.get(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=30)
        answer.raise_for_status()
        for alert in answer.json()["data"]["alerts"]:
            if alert["labels"].get("alertname") == "GridpilotMatcherDown" and (
                    state is None or alert["state"] == state):
                found: dict[str, Any] = alert
                return found
        return None

    # -- the end state -------------------------------------------------------------------------

    def _end_state(self) -> None:
        ids = [str(x.job_id) for x in self.expected.values()]
        left = max(60.0, BUDGET - self.log.elapsed() - 90)
        self.log(f"waiting for every job to end (at most {left:.0f} s)")
        self.user.run("wait", *ids, "--timeout", str(int(left)), "--interval", "3",
                      check=False)
        jobs = {x.job_id: self.job(x.job_id) for x in self.expected.values()}
        pilots = {p["reference"]: p for p in self.api.pilots()}
        # What each killed pilot ran in all: nothing beyond what it held at its kill.
        killed_ran = {p: self._pilot_jobs(p) for p in self.killed_pilots}
        queue_of = {ARC_SITE: ARC_QUEUE, SLURM_SITE: SLURM_QUEUE}
        for x in self.expected.values():
            job = jobs[x.job_id]
            matched = sum(1 for h in job["history"] if h["status"] == "Matched")
            runs = starts(job["history"])
            ran_at = job.get("site")
            explain_ok: bool | None = None
            if job["status"] in ("Done", "Failed") and ran_at in queue_of:
                explained = self.user.run("explain", str(x.job_id), "--queue", queue_of[ran_at],
                                          "--json", check=False)
                explain_ok = explained.returncode == 0
            after_kill = [p for p in self.killed_pilots
                          if x.job_id in killed_ran[p] - self.held_at_kill[p]
                          or (x.job_id in self.back_to_killed
                              and self.killed_pilot_jobs[p] == x.job_id)]
            row = {"label": x.label, "job": x.job_id, "expected": x.status,
                   "status": job["status"], "site": ran_at or "", "matched": matched,
                   "runs": runs, "expected_runs": x.runs,
                   "reschedules": job["reschedule_count"],
                   "explain": explain_ok, "to_killed_pilot": len(after_kill),
                   "pilot": job.get("pilot_reference") or "",
                   "trail": " > ".join(h["status"] for h in job["history"])}
            self.report.jobs.append(row)
            self.report.check("no job lost", job["status"] in FINAL)
            self.report.check("every job in the final state it should have",
                              job["status"] == x.status)
            self.report.check("every job ran at the site it must run at",
                              x.site is None or job["status"] == "Killed" or ran_at == x.site)
            self.report.check("no job run more often than it was rescheduled",
                              runs <= x.runs and runs <= 1 + job["reschedule_count"])
            self.report.check("no job matched to a pilot after that pilot's kill",
                              not after_kill)
            self.report.check("explain agrees with where each job ran", explain_ok is not False)
        # What each killed pilot said at its end, and every ended pilot's log.
        for reference in self.killed_pilots:
            self.report.check("killed pilots ended", pilots.get(reference, {}).get(
                "status") in PILOT_ENDED)
            # On the worker node too: no process of the pilot is left (a CE may ignore a
            # cancel, as ARC's fork back end does).
            survivors = subprocess.run(["pgrep", "-f", "--", f"--reference {reference}"],
                                  capture_output=True, text=True, check=False).stdout.split()
            self.report.check("killed pilots' processes are gone", not survivors)
            self.report.figures[f"pilot_kill_to_end_s[{pilots[reference]['executor']}]"] = (
                self.kill_to_end.get(reference, "more than 30"))
        self._arex_cost(list(pilots.values()))
        self._pilot_logs()
        self._output_sandbox()

    def _arex_cost(self, pilots: list[dict[str, Any]]) -> None:
        """What stopping A-REX cost the ARC site: its pilots that ended badly meanwhile, and
        how long after it came back the director sent the next pilot there."""
        fault = getattr(self, "arex_fault", None)
        if fault is None or fault.ended_at is None:
            return
        arc = [p for p in pilots if p["executor"] == "arc"]

        def when(p: dict[str, Any], key: str) -> datetime | None:
            return datetime.fromisoformat(p[key].replace("Z", "+00:00")) if p.get(key) else None

        lost = [p for p in arc if p["status"] in ("Failed", "Aborted", "Lost")
                and p["reference"] not in self.killed_pilots
                and (when(p, "updated_at") or fault.at) >= fault.at]
        after = sorted(t for p in arc if (t := when(p, "submitted_at")) and t > fault.ended_at)
        self.report.figures["arex_stop_pilots_ended_badly"] = len(lost)
        self.report.figures["arex_back_to_next_arc_pilot_s"] = (
            round((after[0] - fault.ended_at).total_seconds(), 1) if after
            else "none sent after (no work left for ARC)")

    def _matched_after_kill(self, job: dict[str, Any], reference: str) -> bool:
        """Whether the job's last match is later than the pilot's kill."""
        matched = [h["at"] for h in job["history"] if h["status"] == "Matched"]
        return bool(matched) and datetime.fromisoformat(
            matched[-1].replace("Z", "+00:00")) > self.killed_pilots[reference]

    def _pilot_logs(self) -> None:
        def settled() -> list[dict[str, Any]] | None:
            pilots = self.api.pilots()
            ended = [p for p in pilots if p["status"] in PILOT_ENDED]
            return ended if all(p["log"] != "followed" for p in ended) else None

        try:
            ended = self.wait("every ended pilot's log kept", settled, 90, 3)
        except ScenarioError as exc:
            self.log(str(exc))
            ended = [p for p in self.api.pilots() if p["status"] in PILOT_ENDED]
        fetched = 0
        for p in ended:
            done = self.operator.run("pilot-log", p["reference"], check=False)
            fetched += done.returncode == 0
        self.report.figures["pilots"] = len(self.api.pilots())
        self.report.figures["pilots_ended"] = len(ended)
        self.report.figures["pilot_logs_fetched"] = fetched
        self.report.check("each ended pilot's log retrievable", fetched == len(ended) > 0)

    def _output_sandbox(self) -> None:
        hello = self.expected["hello"].job_id
        folder = self.work / "output"
        done = self.user.run("output", str(hello), "--dir", str(folder), check=False)
        result = folder / "result.txt"
        ok = done.returncode == 0 and result.is_file() and "acceptance" in result.read_text()
        self.report.check("the OutputSandbox fetched", ok)

    def _faults_cost(self) -> None:
        for fault in self.faults:
            end = (fault.ended or self.log.elapsed()) + 15
            # A killed matcher costs at its kill and at its return, each within 15 s; what
            # happens between (other faults) is not its doing.
            windows = ([(fault.started, fault.started + 15), (fault.ended - 1, end)]
                       if fault is self.matcher_fault else [(fault.started, end)])
            cost = self.probe.failures(windows)
            self.report.faults.append({"fault": fault.name,
                                       "lasted_s": round((fault.ended or end) - fault.started, 1),
                                       **cost})
            self.report.check("every failed request said when to come back",
                              cost["without_retry_after"] == 0)
        self.report.figures["rescheduled_jobs"] = sum(
            1 for row in self.report.jobs if row["reschedules"])


def starts(history: Sequence[dict[str, Any]]) -> int:
    """How often a job was started by a pilot: a Running entry right after a Matched one. A
    match its pilot never confirmed (back to its queue) is no start, nor Running again after
    Stalled."""
    return sum(1 for before, after in pairwise(history)
               if before["status"] == "Matched" and after["status"] == "Running")


# -- the table -------------------------------------------------------------------------------

def table(report: Report) -> str:
    head = ("job", "label", "expected", "status", "site", "runs", "matched", "resched",
            "explain", "killed-pilot")
    rows = [head] + [(str(r["job"]), r["label"], r["expected"], r["status"], r["site"],
                      f"{r['runs']}/{r['expected_runs']}", str(r["matched"]),
                      str(r["reschedules"]),
                      {True: "agrees", False: "DISAGREES", None: "-"}[r["explain"]],
                      str(r["to_killed_pilot"])) for r in report.jobs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
             for row in rows]
    lost = sum(1 for r in report.jobs if r["status"] not in FINAL)
    twice = sum(1 for r in report.jobs if _run_too_often(r))
    to_killed = sum(r["to_killed_pilot"] for r in report.jobs)
    disagree = sum(1 for r in report.jobs if r["explain"] is False)
    lines += ["", f"lost {lost}, run more often than rescheduled {twice}, matched to a killed "
                  f"pilot {to_killed}, explain disagreeing {disagree}", ""]
    lines += [f"fault: {f['fault']}: lasted {f['lasted_s']} s; {f['failed']} of "
              f"{f['requests']} probe requests failed over {f['seconds']} s "
              f"(statuses {f['statuses'] or '-'}; {f['without_retry_after']} without "
              "Retry-After)" for f in report.faults]
    lines += [f"{k}: {v}" for k, v in sorted(report.figures.items())]
    lines += [""] + [f"{'ok  ' if ok else 'FAIL'}  {name}" for name, ok in report.checks.items()]
    # Last, where a CI log's tail shows it: each job that broke a check, with its history.
    wrong = [r for r in report.jobs if r["status"] != r["expected"] or _run_too_often(r)
             or r["to_killed_pilot"] or r["explain"] is False]
    lines += [""] * bool(wrong) + [
        f"job {r['job']} ({r['label']}): {r['status']}, ran {r['runs']} time(s) for "
        f"{r['expected_runs']} expected, pilot {r['pilot'] or '-'}; history: "
        f"{r.get('trail', '')}" for r in wrong]
    return "\n".join(lines)


def _run_too_often(row: dict[str, Any]) -> bool:
    return bool(row["runs"] > min(row["expected_runs"], 1 + row["reschedules"]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make acceptance", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--work", type=Path, default=None,
                        help="a folder for the deployment (default: a new one under /tmp, "
                             "removed at the end); it must be reachable by the daemons' user")
    parser.add_argument("--artifacts", type=Path, default=None,
                        help="where report.json goes (default: work/artifacts/acceptance, "
                             "acceptance-ha with --ha, under $GRIDPILOT_TEST_ARTIFACTS if set)")
    parser.add_argument("--ha", action="store_true",
                        help="run the central service on the highly available PostgreSQL "
                             "(tools/pg-ha, started when down) and switch its primary over "
                             "during the scenario")
    args = parser.parse_args(argv)
    if args.artifacts is None:
        args.artifacts = Path(os.environ.get("GRIDPILOT_TEST_ARTIFACTS",
                                             ROOT / "work" / "artifacts")) / (
            "acceptance-ha" if args.ha else "acceptance")
    stop_on_signals()
    log = Log()
    folder = args.work or Path(tempfile.mkdtemp(prefix="gridpilot-acceptance-"))
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    grid = Grid(folder, ha=args.ha)
    report: Report | None = None
    error = ""
    try:
        grid.deploy(log)
        log(f"deployed in {log.elapsed():.0f} s: {grid.url}")
        work = folder / "user"
        work.mkdir(exist_ok=True)
        scenario = Scenario(grid, work, log)
        try:
            report = scenario.run()
        finally:
            report = report or scenario.report
    except (ScenarioError, DeployError, requests.RequestException,
            subprocess.TimeoutExpired) as exc:
        error = f"{type(exc).__name__}: {exc}"
        log(f"the scenario stopped: {error}")
    except KeyboardInterrupt:
        error = "interrupted"
        log("interrupted: cleaning up")
    finally:
        grid.down(log)
        if args.work is None:
            shutil.rmtree(folder, ignore_errors=True)
    report = report or Report()
    report.figures["seconds"] = round(log.elapsed(), 1)
    if error:
        report.check(f"the scenario ran to its end ({error[:200]})", False)
    report.check(f"within the budget of {BUDGET} s", log.elapsed() <= BUDGET)
    args.artifacts.mkdir(parents=True, exist_ok=True)
    (args.artifacts / "report.json").write_text(json.dumps(asdict(report), indent=2))
    print(table(report))
    return 0 if report.checks and all(report.checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
