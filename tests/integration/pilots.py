"""Pilot processes of the integration tests. :func:`start_pilot` starts one in a session of
its own and keeps it; the autouse fixture of tests/integration/conftest.py ends what a test
left running (a failed assertion before the pilot's exit, for one): SIGTERM, which makes the
pilot stop its payloads (in sessions of their own) within its grace time, then SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pilot.reaper import descendants, process_table, read_proc

#: The pilots started by the running test.
STARTED: list[subprocess.Popen[Any]] = []
#: How long a pilot has to end after SIGTERM before SIGKILL (its --grace and a last attempt
#: at its reports).
STOP_WAIT = 60.0


def start_pilot(command: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    proc: subprocess.Popen[Any] = subprocess.Popen(command, start_new_session=True, **kwargs)
    STARTED.append(proc)
    return proc


def stop_started_pilots() -> list[int]:
    """End every pilot the test started that still runs; return their pids."""
    started = list(STARTED)
    left = [proc for proc in started if proc.poll() is None]
    STARTED.clear()
    for proc in left:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    for proc in left:
        try:
            proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for proc in started:  # the pipes of a pilot the test did not read to its end
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return [proc.pid for proc in left]


def payload_processes(pilot_pid: int, folder: Path) -> dict[int, int]:
    """The processes of the payload a pilot runs in the job folder ``folder``, pid → start
    time: the pilot's child working there (the payload's first process, or its sandbox's,
    pilot.isolation) and every process under it. Pids of the test's namespace: a payload's
    own pid, in its sandbox's PID namespace, means nothing here."""
    table = process_table()
    roots = [p for p in table.values() if p.ppid == pilot_pid and _cwd(p.pid) == folder]
    found = {p.pid: p.start for p in roots}
    for root in roots:
        found.update({p.pid: p.start for p in descendants(root.pid, table).values()})
    return found


def running(processes: dict[int, int]) -> list[int]:
    """Those of ``processes`` (pid → start time) that still run (not ended, not zombies)."""
    left = []
    for pid, start in processes.items():
        proc = read_proc(pid)
        if proc is not None and proc.start == start and proc.state not in ("Z", "X"):
            left.append(pid)
    return left


def _cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None
