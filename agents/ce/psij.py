"""Pilots through PSI/J: a local process, or a job of a batch system the director's host can
submit to (Slurm, PBS, LSF, Flux, Cobalt).

One :class:`PsijCE` per executor name and agent process. PSI/J's batch executors poll their
batch system for all their jobs at once (``queue_polling_interval``) and the local one
watches its processes; their status callbacks only note the latest state here, and
:meth:`PsijCE.states` hands those notes to the director, which records them. A pilot
submitted by an earlier agent process is attached again by its native id; one the batch
system no longer knows is reported Lost.

Each pilot has a folder of its own, ``<pilot_workdir>/<reference>``: its working directory,
its token file and its standard output and error, which stay there until the director has
kept them and cleaned the pilot.
"""

from __future__ import annotations

import getpass
import shutil
import threading
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import psij
from psij.executors.batch.batch_scheduler_executor import BatchSchedulerExecutorConfig

from agents.ce.base import (
    QUEUED,
    STAGE,
    STDERR_FILE,
    STDOUT_FILE,
    TOKEN_FILE,
    CEError,
    CELoads,
    CEPilot,
    CERefused,
    CEState,
    CEUnavailable,
    PilotOutput,
    PilotSpec,
    PilotUnknown,
)
from agents.ce.files import read_tail, write_private_file

#: PSI/J job states → pilot statuses.
STATES: dict[str, str] = {"NEW": "Submitted", "QUEUED": "Waiting", "ACTIVE": "Running",
                          "COMPLETED": "Done", "FAILED": "Failed", "CANCELED": "Aborted"}
#: The PSI/J states a pilot may hang in before it runs, by kind of wait (agents.ce.base);
#: PSI/J tells no held batch job from a queued one.
WAITING_KINDS: dict[str, str] = {"NEW": STAGE, "QUEUED": QUEUED}
#: Executors that render a batch script and poll a batch system.
BATCH_EXECUTORS = frozenset({"slurm", "pbs", "lsf", "cobalt", "flux"})
CORES_AS_PROCESSES = frozenset({"pbs", "lsf"})
JOB_NAME_DIRECTIVE = {"slurm": "slurm.job-name", "pbs": "pbs.N", "lsf": "lsf.J"}


class PsijCE:
    """The pilots of one PSI/J executor (``local``, ``slurm``, ...)."""

    def __init__(self, executor: str, workdir: Path, *, polling_interval: int = 30) -> None:
        self.executor_name = executor
        self.name = f"psij:{executor}"
        #: The parent of every pilot's folder.
        self.workdir = workdir
        self.polling_interval = polling_interval
        self._executor: Any = None
        self._lock = threading.Lock()
        #: PSI/J's job id → pilot reference, for the status callback.
        self._references: dict[str, str] = {}
        #: reference → the PSI/J job this process watches, and the last state it reported.
        self._jobs: dict[str, Any] = {}
        self._latest: dict[str, CEState] = {}

    # -- the interface -----------------------------------------------------------------------

    def submit(self, specs: Sequence[PilotSpec]) -> list[str | CEError]:
        out: list[str | CEError] = []
        for spec in specs:
            if out and isinstance(out[-1], CEError):
                # The batch system refused one: the others are not tried (each would start
                # the same failing command).
                out.append(CERefused(f"pilot {spec.reference} was not submitted: the one "
                                     "before it was refused"))
                continue
            try:
                out.append(self._submit(spec))
            except CEError as exc:
                out.append(exc)
            except Exception as exc:  # what PSI/J or the batch system's command raised
                out.append(CERefused(f"{self.name}: {type(exc).__name__}: {exc}"[:500]))
        return out

    def states(self, pilots: Sequence[CEPilot]) -> dict[str, CEState]:
        out: dict[str, CEState] = {}
        unwatched = [p for p in pilots if p.reference not in self._jobs]
        if unwatched:
            out.update(self._attach(unwatched))
        with self._lock:
            for p in pilots:
                state = self._latest.get(p.reference)
                if state is not None:
                    out[p.reference] = state
        return out

    def kill(self, pilots: Sequence[CEPilot]) -> dict[str, CEError | None]:
        out: dict[str, CEError | None] = {}
        unwatched = [p for p in pilots if p.reference not in self._jobs]
        lost = self._attach(unwatched) if unwatched else {}
        for p in pilots:
            job = self._jobs.get(p.reference)
            if job is None:
                out[p.reference] = PilotUnknown(
                    f"{self.name} does not know pilot {p.reference} "
                    f"({lost.get(p.reference, CEState('Lost')).reason or 'gone'})")
                continue
            try:
                self._get_executor().cancel(job)
                out[p.reference] = None
            except Exception as exc:
                out[p.reference] = CERefused(
                    f"{self.name} could not cancel pilot {p.reference}: "
                    f"{type(exc).__name__}: {exc}"[:500])
        return out

    def outputs(self, pilots: Sequence[CEPilot], limit: int) -> dict[str, PilotOutput | CEError]:
        found: dict[str, PilotOutput | CEError] = {}
        for pilot in pilots:
            folder = self.folder(pilot.reference)
            if not folder.is_dir():
                found[pilot.reference] = PilotUnknown(
                    f"pilot {pilot.reference} has no folder {folder} any more")
                continue
            out, cut_out = read_tail(folder / STDOUT_FILE, limit)
            err, cut_err = read_tail(folder / STDERR_FILE, limit)
            found[pilot.reference] = PilotOutput(out, err, cut_out or cut_err)
        return found

    def keep_credentials(self) -> None:
        """Nothing to keep: a PSI/J executor's pilots run with the agent's own rights."""

    def credential_warning(self) -> str:
        return ""

    def clean(self, pilots: Sequence[CEPilot]) -> None:
        for p in pilots:
            shutil.rmtree(self.folder(p.reference), ignore_errors=True)
            with self._lock:
                job = self._jobs.pop(p.reference, None)
                self._latest.pop(p.reference, None)
                if job is not None:
                    self._references.pop(job.id, None)

    def loads(self) -> CELoads | None:
        """A batch system's load is not asked: its own limits hold the pilots back."""
        return None

    # -- what the director's tests and the agents look at ------------------------------------

    def folder(self, reference: str) -> Path:
        if not reference or "/" in reference or reference in (".", ".."):
            raise ValueError(f"{reference!r} cannot name a pilot's folder")
        return self.workdir / reference

    @property
    def watched(self) -> int:
        """How many pilots this process follows whose end PSI/J has not reported yet."""
        with self._lock:
            return sum(1 for ref in self._jobs if ref not in self._latest
                       or self._latest[ref].status not in ("Done", "Failed", "Aborted"))

    # -- PSI/J -------------------------------------------------------------------------------

    def _get_executor(self) -> Any:
        with self._lock:
            if self._executor is None:
                # PSI/J's submit scripts are for this user only (the pilots' tokens are not in
                # them: each pilot's token is a file of mode 0600 in its folder).
                scripts = self.workdir / "psij"
                scripts.mkdir(mode=0o700, parents=True, exist_ok=True)
                scripts.chmod(0o700)
                work = scripts / self.executor_name
                work.mkdir(mode=0o700, exist_ok=True)
                config: Any
                if self.executor_name in BATCH_EXECUTORS:
                    config = BatchSchedulerExecutorConfig(
                        work_directory=work, queue_polling_interval=self.polling_interval,
                        initial_queue_polling_delay=1)
                else:
                    config = psij.JobExecutorConfig(work_directory=work)
                try:
                    executor = psij.JobExecutor.get_instance(self.executor_name, config=config)
                except ValueError as exc:
                    raise CERefused(f"{self.name}: there is no PSI/J executor "
                                    f"{self.executor_name!r} on this host: {exc}") from exc
                if hasattr(executor, "_current_user"):
                    # PSI/J asks os.getlogin(), which fails without a controlling terminal
                    # (a daemon, CI); the effective user is the one whose jobs to list.
                    executor._current_user = getpass.getuser
                executor.set_job_status_callback(self._status_changed)
                self._executor = executor
            return self._executor

    def _submit(self, spec: PilotSpec) -> str:
        folder = self.folder(spec.reference)
        folder.mkdir(parents=True, exist_ok=True)
        write_private_file(folder / TOKEN_FILE, spec.token + "\n")
        for name, data in spec.files.items():
            (folder / name).write_bytes(data)
        memory = spec.memory_mb * 1024 * 1024 if spec.memory_mb else None
        if self.executor_name in CORES_AS_PROCESSES:
            # PSI/J's PBS and LSF templates ask for one CPU per process: the pilot's cores are
            # asked for as processes on one node (the single launcher still starts one pilot).
            resources = psij.ResourceSpecV1(process_count=spec.cores,
                                            processes_per_node=spec.cores, memory=memory)
        else:
            resources = psij.ResourceSpecV1(process_count=1, cpu_cores_per_process=spec.cores,
                                            memory=memory)
        job_name = f"gridpilot-{spec.reference}"[:64]
        directive = JOB_NAME_DIRECTIVE.get(self.executor_name)
        attributes = psij.JobAttributes(
            duration=timedelta(minutes=max(1, spec.wall_minutes)), queue_name=spec.queue_name,
            account=spec.account,
            # PSI/J 0.9.11's templates never render the spec's name: a directive does.
            custom_attributes={directive: job_name} if directive else None)
        job = psij.Job(psij.JobSpec(
            executable=spec.executable, arguments=spec.arguments, directory=folder,
            name=job_name, environment=dict(spec.environment),
            stdout_path=folder / STDOUT_FILE, stderr_path=folder / STDERR_FILE,
            resources=resources, attributes=attributes))
        executor = self._get_executor()
        self._watch(job, spec.reference)
        try:
            executor.submit(job)
        except Exception:
            self._forget(job, spec.reference)
            raise
        if job.native_id is None:
            raise CERefused(f"{self.name}: the executor gave pilot {spec.reference} no "
                            "native id")
        return str(job.native_id)

    def _attach(self, pilots: Sequence[CEPilot]) -> dict[str, CEState]:
        """Follow pilots submitted by an earlier agent process; those the batch system no
        longer knows are Lost."""
        executor = self._get_executor()
        known = self._known_ids(executor)
        out: dict[str, CEState] = {}
        for p in pilots:
            if known is not None and p.native_id not in known and not (
                    executor.work_directory / f"{p.native_id}.ec").exists():
                # A batch executor's attach accepts any id (and later calls a job it cannot
                # find completed): ask the batch system first.
                out[p.reference] = CEState("Lost", "the batch system does not know it")
                continue
            job = psij.Job()
            self._watch(job, p.reference)
            try:
                executor.attach(job, p.native_id)
            except Exception as exc:  # the local process is gone
                self._forget(job, p.reference)
                out[p.reference] = CEState("Lost", f"the batch system does not know it "
                                                   f"({type(exc).__name__})")
        return out

    def _known_ids(self, executor: Any) -> set[str] | None:
        """The ids a batch system lists now, or None (the local executor: attach decides).
        Raises CEUnavailable when the batch system does not answer."""
        if self.executor_name not in BATCH_EXECUTORS:
            return None
        try:
            return {str(i) for i in executor.list()}
        except Exception as exc:
            raise CEUnavailable(f"{self.name} could not list its jobs: "
                                f"{type(exc).__name__}: {exc}"[:500]) from exc

    def _watch(self, job: Any, reference: str) -> None:
        with self._lock:
            self._references[job.id] = reference
            self._jobs[reference] = job

    def _forget(self, job: Any, reference: str) -> None:
        with self._lock:
            self._references.pop(job.id, None)
            if self._jobs.get(reference) is job:
                del self._jobs[reference]

    def _status_changed(self, job: Any, status: Any) -> None:
        with self._lock:
            reference = self._references.get(job.id)
            state = STATES.get(status.state.name)
            if reference is None or state is None:
                return
            reason = ""
            if state in ("Failed", "Aborted"):
                reason = (status.message or f"the batch system says {status.state.name}")
            exit_code = status.exit_code if isinstance(status.exit_code, int) else None
            self._latest[reference] = CEState(state, reason[:255], exit_code,
                                              ce_state=status.state.name)
