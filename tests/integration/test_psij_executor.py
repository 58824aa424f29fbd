"""The PSI/J executor into gridpilot: found by PSI/J's own discovery, submitting to a real
matcher (``gridpilot serve`` on loopback), jobs run by real pilot subprocesses; callbacks,
exit codes, output, cancel of a waiting and of a running job, attach by id, refusals."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psij
import pytest
from psij import (
    InvalidJobException,
    Job,
    JobAttributes,
    JobSpec,
    JobState,
    JobStatus,
    ResourceSpecV1,
    SubmitException,
)

from client.psij_executor import GridpilotExecutorConfig, GridpilotJobExecutor, spec_to_json
from gridpilot import schema
from gridpilot.devserver import matcher_server
from taskqueue.db.database import make_engine
from taskqueue.tokens import issue_token
from tests.helpers import write_token_file

ROOT = Path(__file__).resolve().parents[2]
SECRET = "psij-tests-signing-secret-0123456789"
WAIT = timedelta(seconds=120)


@dataclass(frozen=True)
class Server:
    url: str
    work: Path

    def token(self, subject: str = "alice", role: str = "user", group: str = "lhcb_user"
              ) -> str:
        return issue_token(SECRET, subject=subject, role=role, vo="lhcb", group=group,
                           lifetime=3600)

    def executor(self, **config: Any) -> Any:
        config.setdefault("token", self.token())
        config.setdefault("poll_interval", 0.2)
        return psij.JobExecutor.get_instance(
            "gridpilot", url=self.url, config=GridpilotExecutorConfig(**config))

    def pilot(self, tag: str, *extra: str) -> subprocess.Popen[bytes]:
        """A real pilot that runs only jobs tagged ``tag``, until it is idle for a while."""
        token = write_token_file(self.work / f"pilot-{tag}.token",
                                 self.token("factory", "pilot", "lhcb_pilot"))
        with (self.work / f"pilot-{tag}.log").open("ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "pilot.cli", "--matcher", self.url, "--token-file",
                 str(token), "--vo", "lhcb", "--site", "LCG.CERN.cern", "--ce",
                 "ce503.cern.ch", "--queue", "condor", "--cores", "1", "--submit-pools", "",
                 "--tag", tag, "--required-tag", tag, "--workdir",
                 str(self.work / f"pilot-{tag}"), "--heartbeat", "1", "--grace", "1", *extra],
                stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("psij-matcher")
    url = f"sqlite:///{work / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", work,
                        workers=1) as base:
        yield Server(base, work)


class Recorder:
    """Every status callback the executor fires, per job."""

    def __init__(self) -> None:
        self.states: dict[str, list[JobState]] = {}
        self.lock = threading.Lock()

    def __call__(self, job: Job, status: JobStatus) -> None:
        with self.lock:
            self.states.setdefault(job.id, []).append(status.state)


def tagged(tag: str, executable: str, *arguments: str, **spec: Any) -> JobSpec:
    return JobSpec(executable=executable, arguments=list(arguments),
                   attributes=JobAttributes(duration=timedelta(minutes=5),
                                            custom_attributes={"gridpilot.tags": tag}),
                   **spec)


def new_tag() -> str:
    return f"psij-{uuid.uuid4().hex[:8]}"


def finish(pilot: subprocess.Popen[bytes]) -> None:
    pilot.terminate()
    pilot.wait(timeout=60)


def test_psij_finds_the_executor() -> None:
    assert "gridpilot" in psij.JobExecutor.get_executor_names()


def test_a_job_runs_through_a_pilot_with_callbacks_and_output(server: Server,
                                                              tmp_path: Path) -> None:
    executor = server.executor()
    # PSI/J loads the module from its file by itself: the same class, another module object.
    assert type(executor).__name__ == GridpilotJobExecutor.__name__
    assert executor.name == "gridpilot"
    recorder = Recorder()
    executor.set_job_status_callback(recorder)
    tag = new_tag()
    out = tmp_path / "out.txt"
    job = Job(tagged(tag, "/bin/sh", "-c", 'echo "hello $WHO from $(pwd)"; exit 0',
                     environment={"WHO": "psij"}, stdout_path=out, name="psij-hello",
                     resources=ResourceSpecV1(process_count=1, memory=512 * 1024 * 1024)))
    executor.submit(job)
    assert job.native_id is not None and int(job.native_id) > 0
    assert job.status.state == JobState.QUEUED
    pilot = server.pilot(tag, "--idle-timeout", "2")
    try:
        status = job.wait(timeout=WAIT)
    finally:
        finish(pilot)
    assert status is not None and status.state == JobState.COMPLETED, status
    assert status.exit_code == 0
    assert recorder.states[job.id] == [JobState.QUEUED, JobState.ACTIVE, JobState.COMPLETED]
    assert "hello psij from" in out.read_text(encoding="utf-8")
    record = executor.service.job(int(job.native_id))
    assert record["job_name"] == "psij-hello"
    assert record["memory"] >= 512


def test_stdout_and_stderr_go_to_their_own_paths_and_stdin_comes_from_a_file(
        server: Server, tmp_path: Path) -> None:
    """As psij-python's test_stdin_redirect and test_stderr_redirect: the pilot keeps the two
    streams apart, the files get the whole streams (not a tail), exactly."""
    executor = server.executor()
    tag = new_tag()
    source = tmp_path / "in.txt"
    source.write_text("line one\nline two\n", encoding="utf-8")
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    both = Job(tagged(tag, "/bin/sh", "-c", "tr a-z A-Z; echo -n oops >&2; exit 0",
                      stdin_path=source, stdout_path=out, stderr_path=err))
    err_only = tmp_path / "err-only.txt"
    quiet = Job(tagged(tag, "/bin/sh", "-c", "echo kept out; echo -n _x_ >&2",
                       stderr_path=err_only))
    executor.submit(both)
    executor.submit(quiet)
    source.unlink()  # shipped with the job at submission
    pilot = server.pilot(tag, "--idle-timeout", "2")
    try:
        statuses = [both.wait(timeout=WAIT), quiet.wait(timeout=WAIT)]
    finally:
        finish(pilot)
    for status in statuses:
        assert status is not None and status.state == JobState.COMPLETED, status
    assert out.read_text(encoding="utf-8") == "LINE ONE\nLINE TWO\n"
    assert err.read_text(encoding="utf-8") == "oops"
    assert err_only.read_text(encoding="utf-8") == "_x_"


def test_a_stdin_path_that_cannot_be_read_is_refused_at_submission(server: Server,
                                                                  tmp_path: Path) -> None:
    executor = server.executor()
    missing = tmp_path / "no-such-input.txt"
    job = Job(JobSpec("/bin/cat", stdin_path=missing))
    with pytest.raises(InvalidJobException, match=f"stdin_path {missing}.*cannot be read"):
        executor.submit(job)
    assert job.native_id is None


def test_a_failing_job_is_failed_with_its_exit_code(server: Server) -> None:
    executor = server.executor()
    tag = new_tag()
    job = Job(tagged(tag, "/bin/sh", "-c", "exit 3"))
    seen: list[JobState] = []
    job.set_job_status_callback(lambda j, s: seen.append(s.state))
    executor.submit(job)
    pilot = server.pilot(tag, "--idle-timeout", "2")
    try:
        status = job.wait(timeout=WAIT)
    finally:
        finish(pilot)
    assert status is not None and status.state == JobState.FAILED
    assert status.exit_code == 3
    assert status.message and status.message.startswith("Failed")
    assert seen[-1] == JobState.FAILED


def test_cancel_a_waiting_job(server: Server) -> None:
    executor = server.executor()
    job = Job(tagged(new_tag(), "/bin/true"))
    executor.submit(job)
    job.cancel()
    status = job.wait(timeout=WAIT)
    assert status is not None and status.state == JobState.CANCELED
    assert executor.service.job(int(job.native_id))["status"] == "Killed"


def test_cancel_a_running_job_stops_its_payload(server: Server) -> None:
    executor = server.executor()
    tag = new_tag()
    job = Job(tagged(tag, "/bin/sleep", "300"))
    executor.submit(job)
    pilot = server.pilot(tag, "--idle-timeout", "2")
    try:
        assert job.wait(timeout=WAIT, target_states=[JobState.ACTIVE]) is not None
        executor.cancel(job)
        status = job.wait(timeout=WAIT)
    finally:
        finish(pilot)
    assert status is not None and status.state == JobState.CANCELED
    assert job.status.state == JobState.CANCELED


def test_attach_follows_a_job_from_another_executor(server: Server) -> None:
    first = server.executor()
    tag = new_tag()
    original = Job(tagged(tag, "/bin/echo", "attached"))
    first.submit(original)
    native_id = original.native_id
    assert native_id is not None
    # Another process, later: a new executor and a new Job, attached by the native id.
    second = server.executor(poll_interval=0.3)
    recorder = Recorder()
    second.set_job_status_callback(recorder)
    again = Job()
    second.attach(again, native_id)
    assert again.native_id == native_id
    assert again.status.state == JobState.QUEUED
    pilot = server.pilot(tag, "--idle-timeout", "2")
    try:
        status = again.wait(timeout=WAIT)
    finally:
        finish(pilot)
    assert status is not None and status.state == JobState.COMPLETED
    assert recorder.states[again.id][-1] == JobState.COMPLETED
    assert native_id in second.list()
    # A finished job attaches straight into its final state.
    late = Job()
    server.executor().attach(late, native_id)
    assert late.status.state == JobState.COMPLETED


def test_refusals(server: Server) -> None:
    executor = server.executor()
    with pytest.raises(InvalidJobException, match="node"):
        executor.submit(Job(JobSpec(executable="/bin/true",
                                    resources=ResourceSpecV1(node_count=2))))
    with pytest.raises(InvalidJobException, match="no executable"):
        executor.submit(Job(JobSpec()))
    with pytest.raises(InvalidJobException, match="job number"):
        executor.attach(Job(), "slurm-42")
    with pytest.raises(InvalidJobException, match="job 999999999 does not exist"):
        executor.attach(Job(), "999999999")
    with pytest.raises(SubmitException, match="not valid"):
        server.executor(token=issue_token("another-secret-0123456789", subject="x",
                                          role="user", vo="lhcb", group="lhcb_user",
                                          lifetime=60)).submit(Job(JobSpec("/bin/true")))
    unreachable = psij.JobExecutor.get_instance(
        "gridpilot", url="http://127.0.0.1:9", config=GridpilotExecutorConfig(token="t"))
    with pytest.raises(SubmitException, match="cannot reach"):
        unreachable.submit(Job(JobSpec("/bin/true")))


def test_spec_to_json_maps_psij_names() -> None:
    spec = JobSpec(executable="/bin/app", arguments=["-n", 3], environment={"N": 3},
                   name="app", resources=ResourceSpecV1(process_count=2,
                                                        cpu_cores_per_process=2,
                                                        memory=2 * 1024 ** 3),
                   attributes=JobAttributes(
                       duration=timedelta(seconds=90.5), queue_name="long",
                       custom_attributes={"gridpilot.site": "LCG.CERN.cern",
                                          "gridpilot.banned_sites": ["LCG.RAL.uk"],
                                          "platform": "x86_64-el9", "JobType": "User",
                                          "slurm.constraint": "haswell"}))
    body = spec_to_json(spec)
    assert body["arguments"] == ["-n", "3"]
    assert body["environment"] == {"N": "3"}
    assert body["resources"]["process_count"] == 2
    assert body["resources"]["memory"] == 2 * 1024 ** 3
    assert body["attributes"]["duration"] == 91
    assert body["attributes"]["custom_attributes"] == {
        "Site": ["LCG.CERN.cern"], "BannedSite": ["LCG.RAL.uk"], "Platform": ["x86_64-el9"],
        "JobType": "User"}
    assert (body["stdout_path"], body["stderr_path"]) == ("psij.stdout", "psij.stderr")
    assert "stdin_path" not in body and "input_sandbox" not in body
    body = spec_to_json(JobSpec(executable="/bin/cat", attributes=JobAttributes(
        custom_attributes={"InputSandbox": ["LFN:/lhcb/x"]})), "sha256:ab")
    assert body["stdin_path"] == "psij.stdin"
    assert body["input_sandbox"] == ["LFN:/lhcb/x", "sha256:ab"]
    with pytest.raises(InvalidJobException, match=r"set by the executor.*stderr_path"):
        spec_to_json(JobSpec(executable="/bin/app", attributes=JobAttributes(
            custom_attributes={"gridpilot.StdError": "e.txt"})))
    with pytest.raises(InvalidJobException, match="second time"):
        spec_to_json(JobSpec(executable="/bin/app", attributes=JobAttributes(
            custom_attributes={"site": "A", "gridpilot.Site": "B"})))
