"""``gridpilot serve`` as an operator starts it: one line saying where it listens and with
which database, a warning when the URL pilots are given does not reach it, a one-line error
for a port that is taken, and an access log when asked."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
from click.testing import CliRunner

from gridpilot.cli import cli
from gridpilot.devserver import free_port

ROOT = Path(__file__).resolve().parents[2]
SECRET = secrets.token_urlsafe(32)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    db = tmp_path / "g.db"
    env = {"GRIDPILOT_DATABASE_URL": f"sqlite:///{db}", "GRIDPILOT_AUTH_SECRET": SECRET,
           "GRIDPILOT_RESOURCES_FILE": str(ROOT / "conf" / "resources.toml"),
           "GRIDPILOT_MATCHER_METRICS_DIR": str(tmp_path / "metrics"), **extra}
    if not db.exists():
        assert CliRunner().invoke(cli, ["db", "upgrade"], env=env).exit_code == 0
    return {**os.environ, **env}


@contextmanager
def _serve(tmp_path: Path, port: int, *args: str, **env: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gridpilot", "serve", "--bind", f"127.0.0.1:{port}",
         "--workers", "1", *args], env=_env(tmp_path, **env), cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # A line that never comes must not hang the test: the service is stopped after a
    # while, and the stream read then ends.
    stopper = threading.Timer(300, proc.terminate)
    stopper.start()
    try:
        yield proc
    finally:
        stopper.cancel()
        proc.terminate()
        proc.wait(timeout=60)
        for stream in (proc.stdout, proc.stderr):
            assert stream is not None
            stream.close()


def _line_containing(stream: object, text: str) -> str:
    """The first line of STREAM holding TEXT (read until it comes or the stream ends)."""
    assert hasattr(stream, "readline")
    while True:
        line: str = stream.readline()
        if not line or text in line:
            return line


def test_it_says_where_it_listens_and_warns_of_a_url_pilots_cannot_use(tmp_path: Path) -> None:
    port, elsewhere = free_port(), free_port()
    with _serve(tmp_path, port, GRIDPILOT_MATCHER_URL=f"http://127.0.0.1:{elsewhere}") as proc:
        first = _line_containing(proc.stdout, "listening")
        assert first.strip() == (
            f"gridpilot serve: listening on http://127.0.0.1:{port} (1 worker(s) of 4 threads), "
            f"database sqlite:///{tmp_path / 'g.db'}; pilots are given "
            f"http://127.0.0.1:{elsewhere}")
        warning = _line_containing(proc.stderr, "warning")
        assert warning.strip() == (
            f"gridpilot serve: warning: [matcher] url http://127.0.0.1:{elsewhere}, the URL "
            f"pilots are given, does not reach this service (connection refused or no route); "
            f"set [matcher] url (or GRIDPILOT_MATCHER_URL) to the address worker nodes reach "
            f"it at")


def test_a_name_that_does_not_resolve_is_named(tmp_path: Path) -> None:
    port = free_port()
    with _serve(tmp_path, port, GRIDPILOT_MATCHER_URL="http://gridpilot.invalid:8080") as proc:
        warning = _line_containing(proc.stderr, "warning")
        assert "(the name gridpilot.invalid does not resolve)" in warning


def test_no_warning_when_the_url_reaches_it(tmp_path: Path) -> None:
    """The check runs as a process of its own: its exit code says what it found."""
    port = free_port()
    with _serve(tmp_path, port, GRIDPILOT_MATCHER_URL=f"http://127.0.0.1:{port}") as proc:
        _line_containing(proc.stdout, "listening")
        check = subprocess.run(
            [sys.executable, "-m", "gridpilot.listening", f"127.0.0.1:{port}",
             f"http://127.0.0.1:{port}/"], capture_output=True, text=True, timeout=300)
        assert (check.returncode, check.stdout, check.stderr) == (0, "", "")
        assert proc.poll() is None


def test_a_taken_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "gridpilot", "serve", "--bind", f"127.0.0.1:{port}"],
            env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"Error: cannot listen on 127.0.0.1:{port}: another process listens there"]


def test_the_access_log_has_a_line_per_request(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "access.log"
    with _serve(tmp_path, port, "--access-log", str(log),
                GRIDPILOT_MATCHER_URL=f"http://127.0.0.1:{port}") as proc:
        _line_containing(proc.stdout, "listening")
        deadline = time.monotonic() + 120
        while True:  # the workers may still be starting
            try:
                assert requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).ok
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "the service never answered"
                time.sleep(0.2)
    assert any('"GET /healthz HTTP/1.1" 200' in line
               for line in log.read_text(encoding="utf-8").splitlines())
