"""Running one payload: its own work directory, environment and ``$JOBFEATURES``; its process
group, so that stopping it stops everything it started; its CPU time and output tail."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pilot.features import write_features
from pilot.planning import expected_end
from pilot.protocol import JobPayload

#: Bytes of output sent back with the final report.
TAIL_BYTES = 16 * 1024
#: Environment variables of the pilot a payload never sees (its credentials).
PRIVATE_ENV = ("GRIDPILOT_PILOT_TOKEN",)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class Payload:
    job: JobPayload
    cores: int
    memory_mb: int
    directory: Path
    process: subprocess.Popen[bytes]
    started: float
    #: When it is expected to end (requested CPU time and CPU factor), and when at the latest.
    expected_end: float
    max_end: float
    stdout_path: Path
    stderr_path: Path | None
    #: Set once the pilot asked it to stop: (when, why).
    stopping: tuple[float, str] | None = None
    killed: bool = False
    exit_code: int | None = field(default=None)

    @property
    def job_id(self) -> int:
        return self.job.job_id

    def poll(self) -> int | None:
        """The exit code once it has ended (a signal N gives 128 + N), else None."""
        if self.exit_code is None:
            code = self.process.poll()
            if code is not None:
                self.exit_code = 128 - code if code < 0 else code
        return self.exit_code

    def cpu_used(self) -> float:
        """CPU seconds used by the payload's main process and its reaped children."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
            return ticks / _CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            return 0.0

    def stop(self, reason: str, now: float) -> None:
        """Ask the payload's whole process group to end (SIGTERM); :meth:`enforce` kills it
        if it is still there after the grace period."""
        if self.stopping is None and self.poll() is None:
            self.stopping = (now, reason)
            _signal_group(self.process, signal.SIGTERM)

    def enforce(self, now: float, grace: float) -> None:
        if self.stopping is not None and self.poll() is None and now - self.stopping[0] >= grace:
            _signal_group(self.process, signal.SIGKILL)
            self.killed = True

    def tail(self) -> str:
        parts = [_tail(self.stdout_path)]
        if self.stderr_path is not None:
            parts.append(_tail(self.stderr_path))
        text = "".join(p for p in parts if p)
        return text[-TAIL_BYTES:]


def start_payload(job: JobPayload, *, cores: int, memory_mb: int, root: Path, now: float,
                  max_end: float, cpu_factor: float | None,
                  machine_features: str | None, base_env: Mapping[str, str]) -> Payload:
    """Start ``job`` in ``root/job_<id>`` with ``cores`` cores: the pilot is the resource
    provider, so the payload gets its own ``$JOBFEATURES`` saying what it was given."""
    directory = root / f"job_{job.job_id}"
    directory.mkdir(parents=True, exist_ok=True)
    features = directory / ".jobfeatures"
    wall = max(0, int(max_end - now))
    factor = cpu_factor or 1.0
    values: dict[str, object] = {"allocated_CPU": cores, "jobstart_secs": int(now),
                                 "cpufactor_lrms": factor}
    if wall > 0:
        values.update(wall_limit_secs_lrms=wall, wall_limit_secs=int(wall * factor))
    if job.cpu_time > 0:
        values.update(cpu_limit_secs=job.cpu_time,
                      cpu_limit_secs_lrms=max(1, int(job.cpu_time / factor)))
    if memory_mb:
        values["mem_limit_MB"] = memory_mb
    write_features(features, values)
    env = {k: v for k, v in base_env.items() if k not in PRIVATE_ENV}
    env.update(job.environment)
    env.update({"JOBFEATURES": str(features), "GRIDPILOT_JOB_ID": str(job.job_id),
                "GRIDPILOT_JOB_CORES": str(cores), "OMP_NUM_THREADS": str(cores)})
    if machine_features:
        env["MACHINEFEATURES"] = machine_features
    stdout_path = directory / (job.stdout or "output.log")
    stderr_path = directory / job.stderr if job.stderr and job.stderr != job.stdout else None
    with stdout_path.open("wb") as out:
        err = stderr_path.open("wb") if stderr_path else None
        try:
            process = subprocess.Popen(
                [job.executable, *job.arguments], cwd=directory, env=env,
                stdin=subprocess.DEVNULL, stdout=out,
                stderr=err if err is not None else subprocess.STDOUT,
                start_new_session=True)
        finally:
            if err is not None:
                err.close()
    # Expected wall time: the requested CPU time, normalised, spread over the cores.
    return Payload(job, cores, memory_mb, directory, process, now,
                   expected_end(now, job.cpu_time, factor, cores, max_end),
                   max_end, stdout_path, stderr_path)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def wait_all(payloads: list[Payload], grace: float) -> None:
    """Stop every payload and wait for them: SIGTERM, then SIGKILL after ``grace`` seconds."""
    now = time.time()
    for p in payloads:
        p.stop("pilot stopping", now)
    deadline = now + grace
    while any(p.poll() is None for p in payloads) and time.time() < deadline:
        time.sleep(0.05)
    for p in payloads:
        if p.poll() is None:
            _signal_group(p.process, signal.SIGKILL)
            p.killed = True
            p.process.wait()
            p.poll()
