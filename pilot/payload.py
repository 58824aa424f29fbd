"""Running one payload: its own work directory, environment and ``$JOBFEATURES``; its process
group, so that stopping it stops everything it started; its CPU time and output tail."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pilot.features import write_features
from pilot.isolation import ImageError, Isolation
from pilot.logformat import concerning
from pilot.output import cap_output, open_output, output_path, remove_folder, valid_text
from pilot.payloadtoken import TOKEN_FILE_VARIABLE
from pilot.planning import expected_end
from pilot.protocol import JobPayload
from pilot.reaper import Family, descendants, read_proc, send

#: Bytes of output sent back with the final report.
TAIL_BYTES = 16 * 1024
#: Environment variables of the pilot a payload never sees (its credentials).
PRIVATE_ENV = ("GRIDPILOT_PILOT_TOKEN",)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

log = logging.getLogger("pilot")


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
    #: Every process the payload started (see pilot.reaper), once the pilot tracks them.
    family: Family | None = None
    #: max_end is the pilot's assumption (no wall limit and no shutdown time known).
    max_end_assumed: bool = False
    #: CPU seconds of the first process and the children it waited for, once it has ended.
    root_cpu: float | None = None
    #: It runs in a sandbox (pilot.isolation): its first process is the sandbox's.
    isolated: bool = False
    #: The most CPU seconds its processes were seen to have used (sandboxed payloads).
    seen_cpu: float = 0.0

    @property
    def job_id(self) -> int:
        return self.job.job_id

    def poll(self) -> int | None:
        """The exit code once it has ended (a signal N gives 128 + N), else None."""
        if self.exit_code is None and self._wait(os.WNOHANG):
            code = self.process.returncode
            self.exit_code = 128 - code if code < 0 else code
        return self.exit_code

    def wait(self) -> int:
        while self.poll() is None:
            self._wait(0)
        assert self.exit_code is not None
        return self.exit_code

    def _wait(self, flags: int) -> bool:
        """Reap the first process with wait4, which tells its CPU time; True once ended."""
        if self.process.returncode is not None:
            return True
        try:
            pid, status, usage = os.wait4(self.process.pid, flags)
        except ChildProcessError:  # reaped elsewhere: the exit code is what Popen says
            return self.process.poll() is not None
        if pid == 0:
            return False
        self.root_cpu = usage.ru_utime + usage.ru_stime
        self.process.returncode = os.waitstatus_to_exitcode(status)
        return True

    def cpu_used(self) -> float:
        """CPU seconds used by the payload: its first process and the children it waited
        for, and the processes that escaped it, which the pilot reaps."""
        outside = self.family.cpu_outside_root() if self.family is not None else 0.0
        if self.isolated:
            return self._sandbox_cpu() + outside
        if self.root_cpu is not None:
            return self.root_cpu + outside
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
            return ticks / _CLOCK_TICKS + outside
        except (OSError, IndexError, ValueError):
            return outside

    def _sandbox_cpu(self) -> float:
        """The CPU seconds of a sandboxed payload. Its first process is the sandbox's, idle:
        the payload's time is in the processes under it (each with the children it waited
        for), which the first process counts once they end, unless the sandbox is killed:
        then what they were last seen to use counts (the pilot's scans, every second)."""
        seen = max(self.seen_cpu, self.family.seen_cpu if self.family is not None else 0.0)
        if self.root_cpu is None:
            root = read_proc(self.process.pid)
            tree = descendants(self.process.pid).values()
            seen = max(seen, (root.cpu if root else 0.0) + sum(p.cpu for p in tree))
            self.seen_cpu = seen
            return seen
        return max(self.root_cpu, seen)

    def stop(self, reason: str, now: float) -> None:
        """Ask the payload's whole process group to end (SIGTERM); :meth:`enforce` kills it
        if it is still there after the grace period."""
        if self.stopping is None and self.poll() is None:
            self.stopping = (now, reason)
            self.signal(signal.SIGTERM)

    def enforce(self, now: float, grace: float) -> None:
        if self.stopping is not None and self.poll() is None and now - self.stopping[0] >= grace:
            self.signal(signal.SIGKILL)
            self.killed = True

    def signal(self, signum: int) -> None:
        """Signal the payload's process group and every process known to have escaped it.
        In a sandbox, a signal but SIGKILL goes to the processes under the sandbox's first
        one, not to it: it would end the sandbox at once, not giving the payload its grace."""
        if self.isolated and signum != signal.SIGKILL:
            send({p.pid: p.start for p in descendants(self.process.pid).values()}, signum)
        else:
            _signal_group(self.process, signum)
        if self.family is not None:
            send(self.family.members, signum)

    def cap_output(self, limit: int) -> None:
        """Keep the payload's output files within ``limit`` bytes each (their ends)."""
        for path in (self.stdout_path, self.stderr_path):
            if path is not None:
                cap_output(path, limit, job_id=self.job_id)

    def tail(self) -> str:
        """The end of its output as valid text (invalid UTF-8, NULs and lone surrogates
        are U+FFFD), at most TAIL_BYTES characters."""
        parts = [_tail(self.stdout_path)]
        if self.stderr_path is not None:
            parts.append(_tail(self.stderr_path))
        text = "".join(p for p in parts if p)
        return valid_text(text[-TAIL_BYTES:])


def fresh_job_folder(root: Path, job_id: int) -> Path:
    """``root/job_<id>``, empty: what an earlier attempt left (links included) goes first."""
    directory = root / f"job_{job_id}"
    remove_folder(directory)
    directory.mkdir(parents=True)
    return directory


def resolve_executable(executable: str, directory: Path, search_path: str | None, *,
                       job_id: int | None = None) -> str:
    """The program to start for ``executable``, as DIRAC's job wrapper finds it: a name
    without "/" that is a program on ``search_path`` (the payload's ``PATH``) is that program;
    otherwise a relative name that is a file in the job's folder ``directory`` (shipped in the
    InputSandbox) is that file, by its absolute path, made executable by its owner first
    (the sandbox may have kept no mode bits). Anything else is left as it is, for the
    system to say what is wrong, a name outside the folder too ("../x", or a path through a
    linked folder): no mode outside the job's folder is changed."""
    if not executable or executable.startswith("/"):
        return executable
    if "/" not in executable and shutil.which(executable, path=search_path) is not None:
        return executable
    candidate = directory / executable
    try:
        if not candidate.parent.resolve().is_relative_to(directory.resolve()):
            return executable
        mode = candidate.lstat().st_mode
        linked = stat.S_ISLNK(mode)  # a link is followed, but its target's mode left alone
        if linked:
            mode = candidate.stat().st_mode
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a link loop
        return executable
    if not stat.S_ISREG(mode):
        return executable
    if not linked and not mode & stat.S_IXUSR:
        try:
            candidate.chmod(stat.S_IMODE(mode) | stat.S_IXUSR)
        except OSError as exc:
            log.warning("cannot make %s executable: %s", candidate, exc,
                        extra=concerning(job_id))
    return str(candidate.absolute())


def start_payload(job: JobPayload, *, cores: int, memory_mb: int, root: Path, now: float,
                  max_end: float, cpu_factor: float | None,
                  machine_features: str | None, base_env: Mapping[str, str],
                  fresh: bool = True, token_file: Path | None = None,
                  isolation: Isolation | None = None,
                  gpu_env: Mapping[str, str] | None = None) -> Payload:
    """Start ``job`` in ``root/job_<id>`` with ``cores`` cores: the pilot is the resource
    provider, so the payload gets its own ``$JOBFEATURES`` saying what it was given.
    ``fresh=False``: the folder was made by :func:`fresh_job_folder` (and holds the job's
    input files). ``isolation``: the sandbox it runs in (pilot.isolation; None: bare).
    ``gpu_env``: the variables naming the GPUs it got (pilot.planning.gpu_environment), over
    whatever the job's own environment says of them."""
    directory = fresh_job_folder(root, job.job_id) if fresh else root / f"job_{job.job_id}"
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
    # The node's own token file (if the pilot's environment names one) is not the payload's.
    env = {k: v for k, v in base_env.items()
           if k not in PRIVATE_ENV and k != TOKEN_FILE_VARIABLE}
    env.update(job.environment)
    env.update({"JOBFEATURES": str(features), "GRIDPILOT_JOB_ID": str(job.job_id),
                "GRIDPILOT_JOB_CORES": str(cores), "OMP_NUM_THREADS": str(cores)})
    env.update(gpu_env or {})
    if machine_features:
        env["MACHINEFEATURES"] = machine_features
    if token_file is not None:
        env[TOKEN_FILE_VARIABLE] = str(token_file)
    # The output files stay inside the job folder whatever the job names them.
    stdout_path = output_path(directory, job.stdout, "output.log", job_id=job.job_id)
    stderr_path = (output_path(directory, job.stderr, "error.log", job_id=job.job_id)
                   if job.stderr and job.stderr != job.stdout else None)
    if stderr_path == stdout_path:
        stderr_path = None
    stdin = open_stdin(directory, job.stdin) if job.stdin else None
    try:
        out = open_output(stdout_path, directory)
        err = open_output(stderr_path, directory) if stderr_path else None
    except OSError:
        if stdin is not None:
            os.close(stdin)
        raise
    isolated = isolation is not None and isolation.isolated
    image = job.container_image
    try:  # what cannot start leaves no descriptor open
        program = resolve_executable(job.executable, directory, env.get("PATH", os.defpath),
                                     job_id=job.job_id)
        command = [program, *job.arguments]
        if image is not None and not isolated:
            raise ImageError(f"this pilot runs payloads bare: it cannot run container image "
                             f"{image}")
        if isolated and image is None:
            # What the sandbox could not start fails here, as a bare start would.
            _check_runnable(program, directory, env.get("PATH", os.defpath))
        if isolation is not None:
            command = isolation.command(command, directory, image=image)
        process = subprocess.Popen(
            command, cwd=directory, env=env,
            stdin=stdin if stdin is not None else subprocess.DEVNULL, stdout=out,
            stderr=err if err is not None else subprocess.STDOUT,
            start_new_session=True)
    finally:
        for fd in (stdin, out, err):
            if fd is not None:
                os.close(fd)
    # Expected wall time: the requested CPU time, normalised, spread over the cores.
    return Payload(job, cores, memory_mb, directory, process, now,
                   expected_end(now, job.cpu_time, factor, cores, max_end),
                   max_end, stdout_path, stderr_path, isolated=isolated)


def _check_runnable(program: str, directory: Path, search_path: str) -> None:
    """OSError, as starting ``program`` would raise it, when it is not there or cannot be
    run: its start in a sandbox only fails inside the sandbox."""
    if "/" in program:
        path: str | None = str(directory / program)
    else:
        path = shutil.which(program, path=search_path)
    if path is None or not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)


def open_stdin(directory: Path, name: str) -> int:
    """Open the file ``name`` of the job folder (shipped in its input sandbox) for the
    payload's standard input; OSError saying "StdInput NAME: why" when it is not a file
    inside the folder (a link is not followed) or cannot be read."""
    pure = PurePosixPath(name)
    path = directory.joinpath(*pure.parts)
    try:
        inside = (not pure.is_absolute() and ".." not in pure.parts and "\x00" not in name
                  and path.parent.resolve().is_relative_to(directory.resolve()))
        if not inside:
            raise OSError(f"StdInput {name}: the name leaves the job folder")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno is None:
            raise
        why = ("a link, which is not followed" if exc.errno == errno.ELOOP
               else exc.strerror or str(exc))
        raise OSError(f"StdInput {name}: {why}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"StdInput {name}: not a file of the job folder")
    return fd


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _tail(path: Path) -> str:
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
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
            p.signal(signal.SIGKILL)
            p.killed = True
            p.wait()
