"""Pilots through PSI/J: one executor instance per name for the agent process, pilots submitted
as PSI/J jobs, and the batch system's view of them written to the pilot records.

PSI/J's batch executors (slurm, pbs, lsf) poll the batch system for all their jobs at once
(``queue_polling_interval``); the local one watches its processes. Their status callbacks move
the pilot records forward (taskqueue.pilots.set_pilot_status never moves one back: a pilot
that said Done itself stays Done). Pilots submitted by an earlier agent process are attached
again by their native id; one the batch system no longer knows is marked Lost.
"""

from __future__ import annotations

import getpass
import os
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import psij
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig

from agents.context import AgentContext
from taskqueue.pilots import executors_in_use, pilots_to_poll, set_pilot_status

#: PSI/J job states → pilot statuses.
STATES: dict[str, str] = {"NEW": "Submitted", "QUEUED": "Waiting", "ACTIVE": "Running",
                          "COMPLETED": "Done", "FAILED": "Failed", "CANCELED": "Aborted"}
#: Executors that render a batch script and poll a batch system.
BATCH_EXECUTORS = frozenset({"slurm", "pbs", "lsf", "cobalt", "flux"})
CORES_AS_PROCESSES = frozenset({"pbs", "lsf"})
JOB_NAME_DIRECTIVE = {"slurm": "slurm.job-name", "pbs": "pbs.N", "lsf": "lsf.J"}


@dataclass(frozen=True)
class PilotSpec:
    """One pilot to start: the command, its environment and what to ask the batch system for.
    The token travels as a file (``token_file``, mode 0600, written at submission; the pilot
    removes it once read), never in the environment, where payloads could read it in
    ``/proc/<pilot pid>/environ``, nor on the command line."""

    reference: str
    executable: str
    arguments: list[str]
    environment: dict[str, str]
    directory: Path
    token: str = field(default="", repr=False)
    token_file: Path | None = None
    cores: int = 1
    memory_mb: int | None = None
    wall_minutes: int = 60
    queue_name: str | None = None
    account: str | None = None


@dataclass
class ExecutorPool:
    ctx: AgentContext
    #: Seconds between two polls of a batch system by PSI/J.
    polling_interval: int = 30
    _executors: dict[str, Any] = field(default_factory=dict)
    #: Jobs this process watches, by id(job) → (executor name, reference).
    _watched: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def executor(self, name: str) -> Any:
        with self._lock:
            if name not in self._executors:
                # PSI/J's submit scripts are for this user only (the pilots' tokens are not in
                # them: each pilot's token is a file of mode 0600 in its folder).
                scripts = Path(self.ctx.settings.agents.pilot_workdir).resolve() / "psij"
                scripts.mkdir(mode=0o700, parents=True, exist_ok=True)
                scripts.chmod(0o700)
                work = scripts / name
                work.mkdir(mode=0o700, exist_ok=True)
                config: Any
                if name in BATCH_EXECUTORS:
                    config = BatchSchedulerExecutorConfig(
                        work_directory=work, queue_polling_interval=self.polling_interval,
                        initial_queue_polling_delay=1)
                else:
                    config = psij.JobExecutorConfig(work_directory=work)
                executor = psij.JobExecutor.get_instance(name, config=config)
                if hasattr(executor, "_current_user"):
                    # PSI/J asks os.getlogin(), which fails without a controlling terminal
                    # (a daemon, CI); the effective user is the one whose jobs to list.
                    executor._current_user = getpass.getuser
                executor.set_job_status_callback(self._status_changed)
                self._executors[name] = executor
            return self._executors[name]

    def submit(self, name: str, spec: PilotSpec) -> str:
        """Submit a pilot; returns the batch system's id for it. Raises what PSI/J raises."""
        spec.directory.mkdir(parents=True, exist_ok=True)
        if spec.token_file is not None:
            write_token_file(spec.token_file, spec.token)
        memory = spec.memory_mb * 1024 * 1024 if spec.memory_mb else None
        if name in CORES_AS_PROCESSES:
            # PSI/J's PBS and LSF templates ask for one CPU per process: the pilot's cores are
            # asked for as processes on one node (the single launcher still starts one pilot).
            resources = psij.ResourceSpecV1(process_count=spec.cores,
                                            processes_per_node=spec.cores, memory=memory)
        else:
            resources = psij.ResourceSpecV1(process_count=1, cpu_cores_per_process=spec.cores,
                                            memory=memory)
        job_name = f"gridpilot-{spec.reference}"[:64]
        attributes = psij.JobAttributes(
            duration=timedelta(minutes=max(1, spec.wall_minutes)), queue_name=spec.queue_name,
            account=spec.account,
            # PSI/J 0.9.11's templates never render the spec's name: a directive does.
            custom_attributes={JOB_NAME_DIRECTIVE[name]: job_name}
            if name in JOB_NAME_DIRECTIVE else None)
        job = psij.Job(psij.JobSpec(
            executable=spec.executable, arguments=spec.arguments, directory=spec.directory,
            name=job_name, environment=dict(spec.environment),
            stdout_path=spec.directory / "pilot.out", stderr_path=spec.directory / "pilot.err",
            resources=resources, attributes=attributes))
        self._watched[job.id] = spec.reference
        self.executor(name).submit(job)
        native_id = job.native_id
        if native_id is None:
            raise RuntimeError(f"the {name} executor gave pilot {spec.reference} no native id")
        return str(native_id)

    def poll(self) -> int:
        """Attach to the not-final pilots this process does not watch yet (submitted by an
        earlier agent process); one the batch system no longer knows is Lost. Returns how
        many were attached."""
        attached = 0
        for name in sorted(self._executors_in_use()):
            watched = set(self._watched.values())
            pending = [(r, n) for r, n in self.ctx.transaction(
                partial(pilots_to_poll, executor=name)) if r not in watched]
            if not pending:
                continue
            executor = self.executor(name)
            known = self._known_ids(name, executor)
            for reference, native_id in pending:
                if known is not None and native_id not in known and not (
                        executor.work_directory / f"{native_id}.ec").exists():
                    # A batch executor's attach accepts any id (and later calls a job it
                    # cannot find completed): ask the batch system first.
                    self._lost(reference, "the batch system does not know it")
                    continue
                job = psij.Job()
                self._watched[job.id] = reference
                try:
                    executor.attach(job, native_id)
                    attached += 1
                except Exception as exc:  # the local process is gone
                    self._watched.pop(job.id, None)
                    self._lost(reference, type(exc).__name__)
        return attached

    def _known_ids(self, name: str, executor: Any) -> set[str] | None:
        """The ids a batch system lists now, or None (the local executor, or a listing that
        failed: then attach decides)."""
        if name not in BATCH_EXECUTORS:
            return None
        try:
            return {str(i) for i in executor.list()}
        except Exception as exc:
            self.ctx.log.warning("the %s batch system could not list its jobs: %s", name, exc)
            return None

    def _lost(self, reference: str, why: str) -> None:
        self.ctx.transaction(partial(
            set_pilot_status, reference=reference, status="Lost", now=self.ctx.now(),
            reason=f"vanished from the batch system ({why})"))

    def _executors_in_use(self) -> set[str]:
        return set(self.ctx.transaction(executors_in_use)) | set(self._executors)

    def _status_changed(self, job: Any, status: Any) -> None:
        reference = self._watched.get(job.id)
        state = STATES.get(status.state.name)
        if reference is None or state is None:
            return
        reason = ""
        if state in ("Failed", "Aborted"):
            reason = (status.message or f"the batch system says {status.state.name}")[:255]
        try:
            self.ctx.transaction(partial(set_pilot_status, reference=reference, status=state,
                                         now=self.ctx.now(), reason=reason))
        except Exception:  # a callback must not kill PSI/J's thread; the next poll retries
            self.ctx.log.exception("pilot %s: status %s not recorded", reference, state)
        if status.state.final:
            self._watched.pop(job.id, None)


def write_token_file(path: Path, token: str) -> None:
    """Write a pilot's token to ``path``, readable by this user only (0600 whatever the
    umask); a file already there (a resubmission) is replaced, a link is not followed."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(token + "\n")
