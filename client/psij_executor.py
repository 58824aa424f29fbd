"""A PSI/J executor that submits into gridpilot: ``JobExecutor.get_instance("gridpilot",
url="https://gridpilot.example.org")``.

PSI/J finds it through ``psij-descriptors/gridpilot_descriptor.py`` (beside this package: in
site-packages from a wheel, at the checkout's root, which an editable install puts on
sys.path), by itself: nothing of gridpilot needs to be imported first. A
:class:`psij.JobSpec` becomes a job in gridpilot's JSON form, which already uses PSI/J's
names: executable, arguments, environment, name; resources (processes, cores per process,
memory in bytes); ``attributes.duration`` (the CPU time) and ``queue_name``; the custom
attributes ``gridpilot.site``, ``gridpilot.banned_sites``, ``gridpilot.platform``,
``gridpilot.tags``, ``gridpilot.job_type``, ``gridpilot.priority``, ``gridpilot.job_group``
(or any JDL field by its own name, with or without the ``gridpilot.`` prefix; keys meant for
other executors, ``slurm.x`` and the like, are left out). The file of ``stdin_path`` is read at
submission and shipped with the job (its input sandbox), the payload's standard input; the
pilot keeps standard output and error apart and returns both whole (up to its output limit) in
the job's output sandbox, written to ``stdout_path`` and ``stderr_path`` when the job ends. The
job runs on a worker node, so ``directory``, ``pre_launch`` and ``post_launch`` (paths on this
host) are not sent; multi-node jobs (``node_count`` above 1) are refused by the service, which
says so.

gridpilot's states map onto PSI/J's: Received, Checking, Waiting, Matched and Rescheduled are
QUEUED; Running, Stalled and Completing are ACTIVE; Done is COMPLETED; Failed is FAILED (with
the exit code and the minor status as message); Killed and Deleted are CANCELED. One thread
per executor polls the service for the jobs it follows (every ``poll_interval`` seconds) and
fires the status callbacks. The job's native id is its gridpilot job id; ``attach`` follows a
job submitted before, by any means.

URL and token come from the arguments, else from what ``gridpilot-client`` reads
(``GRIDPILOT_URL``, ``GRIDPILOT_TOKEN``/``_FILE``, the user's client.toml, the WLCG bearer-token
locations).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from psij import (
    InvalidJobException,
    Job,
    JobExecutor,
    JobExecutorConfig,
    JobSpec,
    JobState,
    JobStatus,
    SubmitException,
)

from client.config import ConfigError, resolve
from client.sandboxes import OutputFolderError, fetch_output, upload
from client.service import Service, ServiceError
from pilot.archive import Member, pack

log = logging.getLogger(__name__)

#: gridpilot status → PSI/J state.
STATES: Mapping[str, JobState] = {
    "Received": JobState.QUEUED, "Checking": JobState.QUEUED, "Waiting": JobState.QUEUED,
    "Matched": JobState.QUEUED, "Rescheduled": JobState.QUEUED,
    "Running": JobState.ACTIVE, "Stalled": JobState.ACTIVE, "Completing": JobState.ACTIVE,
    "Done": JobState.COMPLETED, "Failed": JobState.FAILED,
    "Killed": JobState.CANCELED, "Deleted": JobState.CANCELED,
}
#: Custom attribute names (after an optional "gridpilot." prefix) → JDL field.
CUSTOM: Mapping[str, str] = {
    "site": "Site", "sites": "Site", "banned_site": "BannedSite", "banned_sites": "BannedSite",
    "platform": "Platform", "platforms": "Platform", "tags": "Tags", "job_type": "JobType",
    "priority": "Priority", "job_group": "JobGroup", "requirements": "Requirements",
}
PREFIX = "gridpilot."
#: The names, in the job's folder, of its standard input, output and error: the pilot keeps the
#: streams apart, and returns both in the job's output sandbox.
STDIN, STDOUT, STDERR = "psij.stdin", "psij.stdout", "psij.stderr"
#: JDL fields the executor sets from the spec's paths (lower case).
_STREAMS = {"stdinput": "stdin_path", "stdoutput": "stdout_path", "stderror": "stderr_path"}


class GridpilotExecutorConfig(JobExecutorConfig):
    """How the executor talks to the service: a token (or a file holding it), seconds between
    two status polls, and seconds one request may take."""

    def __init__(self, launcher_log_file: Path | None = None,
                 work_directory: Path | None = None, *, token: str | None = None,
                 token_file: str | None = None, poll_interval: float = 2.0,
                 timeout: float | None = None) -> None:
        super().__init__(launcher_log_file, work_directory)
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval}")
        self.token = token
        self.token_file = token_file
        self.poll_interval = poll_interval
        self.timeout = timeout


def spec_to_json(spec: JobSpec, stdin_sandbox: str | None = None) -> dict[str, Any]:
    """The gridpilot JSON description of ``spec``; InvalidJobException for what cannot run.
    ``stdin_sandbox``: the sandbox holding the file of ``spec.stdin_path`` as STDIN."""
    if not spec.executable:
        raise InvalidJobException("the job spec names no executable")
    body: dict[str, Any] = {"executable": str(spec.executable),
                            "arguments": [str(a) for a in spec.arguments or []],
                            "stdout_path": STDOUT, "stderr_path": STDERR}
    if stdin_sandbox is not None:
        body.update(stdin_path=STDIN, input_sandbox=[stdin_sandbox])
    if spec.environment:
        body["environment"] = {str(k): str(v) for k, v in spec.environment.items()}
    if spec.name:
        body["name"] = spec.name
    resources = spec.resources
    if resources is not None:
        found: dict[str, Any] = {}
        for key in ("node_count", "process_count", "processes_per_node",
                    "cpu_cores_per_process", "gpu_cores_per_process", "memory"):
            value = getattr(resources, key, None)
            if value is not None:
                found[key] = value
        if found:
            body["resources"] = found
    attributes = spec.attributes
    if attributes is not None:
        attrs: dict[str, Any] = {}
        if attributes.duration is not None:
            attrs["duration"] = max(1, math.ceil(attributes.duration.total_seconds()))
        if attributes.queue_name:
            attrs["queue_name"] = attributes.queue_name
        custom = _custom(attributes.custom_attributes or {})
        for key in [k for k in custom if k.lower() == "inputsandbox" and stdin_sandbox]:
            given = custom.pop(key)
            body["input_sandbox"] = [*([given] if isinstance(given, str) else given),
                                     stdin_sandbox]
        if custom:
            attrs["custom_attributes"] = custom
        if attrs:
            body["attributes"] = attrs
    return body


def _custom(given: Mapping[str, object]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in given.items():
        name = key[len(PREFIX):] if key.lower().startswith(PREFIX) else key
        if "." in name:
            continue  # another executor's attribute (slurm.constraint, pbs.x, ...)
        if name.lower() in _STREAMS:
            raise InvalidJobException(
                f"the custom attribute {key!r} is set by the executor: give the spec's "
                f"{_STREAMS[name.lower()]}")
        field = CUSTOM.get(name.lower(), name)
        if field in ("Site", "BannedSite", "Platform", "Tags") and isinstance(value, str):
            value = [value]
        if field in out:
            raise InvalidJobException(f"the custom attribute {key!r} gives {field} a second "
                                      "time")
        out[field] = value
    return out


class GridpilotJobExecutor(JobExecutor):
    """Jobs into a gridpilot matcher over its HTTP API."""

    def __init__(self, url: str | None = None,
                 config: JobExecutorConfig | None = None) -> None:
        config = config or GridpilotExecutorConfig()
        super().__init__(url=url, config=config)
        token = getattr(config, "token", None)
        token_file = getattr(config, "token_file", None)
        self.poll_interval = float(getattr(config, "poll_interval", 2.0))
        try:
            found = resolve(url=url, token=token, token_file=token_file,
                            timeout=getattr(config, "timeout", None), environ=os.environ)
        except ConfigError as exc:
            raise ValueError(f"the gridpilot executor cannot start: {exc}") from exc
        self.url = found.url
        self.service = Service(found.url, found.token, timeout=found.timeout,
                               verify=found.verify)
        self._jobs: dict[int, Job] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._poller: threading.Thread | None = None

    # -- PSI/J's operations --------------------------------------------------------------

    def submit(self, job: Job) -> None:
        spec = self._check_job(job)
        try:
            body = spec_to_json(spec, self._stdin_sandbox(spec))
        except InvalidJobException:
            job.executor = None
            raise
        except ServiceError as exc:
            job.executor = None
            raise SubmitException(exc.detail) from exc
        try:
            answer = self.service.submit(json.dumps(body), "json")
        except ServiceError as exc:
            job.executor = None
            if 400 <= exc.status < 500 and exc.status not in (401, 403, 408, 429):
                raise InvalidJobException(exc.detail) from exc
            raise SubmitException(exc.detail) from exc
        ids = answer.get("job_ids") or []
        if len(ids) != 1:
            job.executor = None
            raise InvalidJobException(f"the spec made {len(ids)} gridpilot jobs, not one")
        job_id = int(ids[0])
        job._native_id = job_id
        self._follow(job_id, job)
        self._set_job_status(job, JobStatus(JobState.QUEUED, metadata={"status": "Received"}))

    def _stdin_sandbox(self, spec: JobSpec) -> str | None:
        """Ship the file of ``spec.stdin_path`` with the job: its sandbox id (None without
        one)."""
        if spec.stdin_path is None:
            return None
        try:
            data = Path(spec.stdin_path).read_bytes()
        except OSError as exc:
            raise InvalidJobException(f"stdin_path {spec.stdin_path} cannot be read: "
                                      f"{exc.strerror or exc}") from exc
        return upload(self.service, pack([Member(STDIN, data)]))

    def cancel(self, job: Job) -> None:
        if job.native_id is None:
            self._set_job_status(job, JobStatus(JobState.CANCELED))
            return
        if job.status.final:
            return
        try:
            answer = self.service.bulk("kill", [int(job.native_id)], "cancelled through PSI/J")
        except ServiceError as exc:
            raise SubmitException(exc.detail) from exc
        for refused in answer["errors"]:
            # A job that ended meanwhile cannot be killed; its final state comes by polling.
            log.info("job %s not killed: %s", job.native_id, refused.get("detail"))
        self._wake.set()

    def list(self) -> list[str]:
        try:
            return [str(j["job_id"]) for j in self.service.jobs({})]
        except ServiceError as exc:
            raise SubmitException(exc.detail) from exc

    def attach(self, job: Job, native_id: str) -> None:
        if job.status.state != JobState.NEW:
            raise InvalidJobException("only a NEW job can be attached")
        try:
            job_id = int(native_id)
        except ValueError as exc:
            raise InvalidJobException(f"a gridpilot native id is a job number, got "
                                      f"{native_id!r}") from exc
        try:
            record = self.service.job(job_id)
        except ServiceError as exc:
            raise InvalidJobException(exc.detail) from exc
        job.executor = self
        job._native_id = job_id
        self._follow(job_id, job)
        self._update(job, record)

    # -- following jobs ------------------------------------------------------------------

    def _follow(self, job_id: int, job: Job) -> None:
        with self._lock:
            self._jobs[job_id] = job
            if self._poller is None or not self._poller.is_alive():
                self._poller = threading.Thread(target=self._poll_loop, daemon=True,
                                                name=f"gridpilot-psij-{self.url}")
                self._poller.start()

    def _poll_loop(self) -> None:
        try:
            self._poll()
        except Exception:  # the thread must say why it stopped, and let a later job restart it
            log.exception("the gridpilot PSI/J poller stopped")
            with self._lock:
                self._poller = None

    def _poll(self) -> None:
        while True:
            self._wake.wait(self.poll_interval)
            self._wake.clear()
            with self._lock:
                followed = dict(self._jobs)
            if not followed:
                with self._lock:
                    if not self._jobs:
                        self._poller = None
                        return
                continue
            for job_id, job in followed.items():
                try:
                    record = self.service.job(job_id)
                except ServiceError as exc:
                    if exc.status == 404:
                        self._set_job_status(job, JobStatus(
                            JobState.CANCELED, message="the job no longer exists"))
                        self._forget(job_id)
                    else:
                        log.warning("cannot read job %s: %s", job_id, exc.detail)
                    continue
                self._update(job, record)

    def _update(self, job: Job, record: Mapping[str, Any]) -> None:
        status = str(record.get("status"))
        state = STATES.get(status)
        if state is None:
            log.warning("job %s has a status PSI/J has no state for: %s", job.native_id, status)
            return
        if state == job.status.state:
            return
        exit_code = record.get("exit_code")
        minor = record.get("minor_status") or ""
        metadata = {"status": status, "minor_status": minor, "site": record.get("site")}
        if state.final and job.native_id is not None:
            self._write_output(job)
            self._forget(int(job.native_id))
        message = f"{status}: {minor}" if minor and state != JobState.COMPLETED else None
        self._set_job_status(job, JobStatus(state, time=time.time(), message=message,
                                            exit_code=exit_code if state.final else None,
                                            metadata=metadata))

    def _forget(self, job_id: int) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)

    def _write_output(self, job: Job) -> None:
        """Write the job's standard output and error to the spec's stdout_path and
        stderr_path, from its output sandbox; a job without one (it never ran, or its pilot
        could not upload it: its minor status says) gives the output tail its pilot reported
        (the end of both streams) to stdout_path."""
        spec = job.spec
        if spec is None or job.native_id is None:
            return
        wanted = {name: Path(path) for name, path in ((STDOUT, spec.stdout_path),
                                                      (STDERR, spec.stderr_path)) if path}
        if not wanted:
            return
        try:
            answer = self.service.output(int(job.native_id))
            with tempfile.TemporaryDirectory(prefix="gridpilot-psij-") as tmp:
                sandbox = answer.get("output_sandbox")
                if sandbox:
                    fetch_output(self.service, str(sandbox), Path(tmp))
                for name, path in wanted.items():
                    got = Path(tmp, name)
                    if got.is_file():
                        shutil.copyfile(got, path)
                    elif name == STDOUT:
                        log.warning("job %s has no output sandbox; its output tail goes to %s",
                                    job.native_id, path)
                        path.write_text(answer.get("output_tail") or "", encoding="utf-8")
        except (ServiceError, OutputFolderError, OSError) as exc:
            log.warning("cannot write the output of job %s: %s", job.native_id, exc)
