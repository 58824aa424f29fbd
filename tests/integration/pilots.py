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
from typing import Any

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
    left = [proc for proc in STARTED if proc.poll() is None]
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
    return [proc.pid for proc in left]
