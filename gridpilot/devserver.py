"""A matcher on loopback for the demo and the tests: ``gridpilot serve`` in a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from taskqueue.core.errors import GridpilotError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def matcher_server(url: str, secret: str, resources_file: Path, work: Path, *,
                   port: int | None = None, workers: int = 2) -> Iterator[str]:
    """``gridpilot serve`` in a subprocess on a loopback port (a free one unless given);
    yields its base URL once it answers /healthz."""
    port = port or free_port()
    env = {**os.environ, "GRIDPILOT_DATABASE_URL": url, "GRIDPILOT_AUTH_SECRET": secret,
           "GRIDPILOT_RESOURCES_FILE": str(resources_file),
           "GRIDPILOT_MATCHER_METRICS_DIR": str(work / "metrics"),
           "GRIDPILOT_MATCHER_URL": f"http://127.0.0.1:{port}"}
    log = (work / f"matcher-{port}.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "gridpilot", "serve", "--bind",
                             f"127.0.0.1:{port}", "--workers", str(workers)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise GridpilotError(f"the matcher exited; see {log.name}")
            try:
                if requests.get(f"{base}/healthz", timeout=5).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):
                pass  # not listening yet, or too busy starting to answer in time
            if time.monotonic() > deadline:
                raise GridpilotError(f"the matcher did not start; see {log.name}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


