"""A real pilot ends when it must, whatever it is waiting for: SIGTERM while a request to
the matcher hangs and its payload ignores SIGTERM; a matcher gone while the pilot holds a
finished job's output and report. Generous timeouts bound the waits; far below the pilot's
own --request-timeout and --report-timeout, so a pilot that waited for them would fail."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from gridpilot import schema
from gridpilot.devserver import matcher_server
from taskqueue.db.database import make_engine
from tests.helpers import write_token_file
from tests.integration.pilots import payload_processes, running, start_pilot, stop_started_pilots
from tests.integration.test_pilot import ROOT, SECRET, Grid

#: Far longer than any wait below: the pilot must not need them.
LONG = "600"
#: How long a test waits for a pilot that should be ending (it needs seconds).
EXIT_WAIT = 90


def payload_of(pilot: subprocess.Popen[str], folder: Path) -> dict[int, int]:
    """The processes of the payload the pilot runs in ``folder`` (its own pid, written from
    a sandbox, would be one of the sandbox's PID namespace)."""
    found = payload_processes(pilot.pid, folder)
    assert found, f"no process of the payload in {folder}"
    return found


class HangingMatcher:
    """A loopback HTTP server that hands out one job on the first match request, and then
    never answers: it reads each later request and holds the connection open."""

    def __init__(self, job: dict[str, object]) -> None:
        self.job = job
        self.paths: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            conn.settimeout(5)
            try:
                head = conn.recv(65536).decode("latin-1")
            except OSError:
                conn.close()
                continue
            path = head.split(" ", 2)[1] if head.count(" ") >= 2 else "/"
            self.paths.append(path)
            if path.endswith("/pilots/match") and len(self.paths) == 1:
                body = json.dumps({"jobs": [self.job]}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
                             + body)
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.listener.close()
        for conn in self.held:
            conn.close()


def test_sigterm_ends_a_pilot_whose_matcher_hangs_and_whose_payload_ignores_it(
        tmp_path: Path) -> None:
    pid_file = tmp_path / "payload.pid"
    job = {"job_id": 7, "vo": "lhcb", "owner": "alice", "owner_group": "lhcb_user",
           "job_type": "User", "executable": "/bin/sh",
           "arguments": ["-c", f"echo $$ > {pid_file}; trap '' TERM; "
                               f"while true; do sleep 1; done"]}
    server = HangingMatcher(job)
    try:
        token_file = write_token_file(tmp_path / "pilot.token", "a.b.c")
        proc = start_pilot(
            [sys.executable, "-m", "pilot.cli", "--matcher", server.url, "--vo", "lhcb",
             "--workdir", str(tmp_path / "work"), "--token-file", str(token_file),
             "--cores", "1", "--grace", "2", "--idle-timeout", LONG, "--request-timeout", LONG,
             "--report-timeout", LONG, "--heartbeat", LONG],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + EXIT_WAIT
        # The payload runs, and the pilot waits for the matcher's answer to its heartbeat.
        while not (pid_file.exists() and pid_file.read_text().strip()
                   and len(server.paths) > 1):
            assert proc.poll() is None and time.monotonic() < deadline, server.paths
            time.sleep(0.1)
        payload = payload_of(proc, tmp_path / "work" / "job_7")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=EXIT_WAIT)
    finally:
        server.close()
    assert running(payload) == []
    assert proc.returncode == 4, out
    assert "Traceback" not in out
    kept = json.loads((tmp_path / "work" / "undelivered-reports.json").read_text())
    assert [r["status"] for r in kept] == ["Running", "Rescheduled"], kept
    assert kept[1]["job_id"] == 7
    assert kept[1]["minor_status"] == "Pilot stopped: pilot received SIGTERM"
    assert "pilot finished (pilot received SIGTERM)" in out


def test_a_pilot_whose_matcher_is_gone_keeps_its_report_and_exits(
        tmp_path: Path) -> None:
    """The matcher stops while the payload runs: the output upload and the report cannot go.
    After --idle-timeout without an answer the pilot gives up, its report kept for
    --replay, although --report-timeout would have it retry for ten minutes."""
    url = f"sqlite:///{tmp_path / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", tmp_path) as base:
        grid = Grid(base, tmp_path)
        jdl = ('[ Executable = "/bin/sh"; Arguments = "-c \'while [ ! -e go ]; do sleep 0.2; '
               'done; echo result > out.txt\'"; CPUTime = 600; OutputSandbox = {"out.txt"} ]')
        answer = grid.user.post(f"{base}/api/v1/jobs", data=jdl.encode(), timeout=30,
                                headers={"Content-Type": "text/plain"})
        assert answer.status_code == 201, answer.text
        (job_id,) = answer.json()["job_ids"]
        proc = grid.pilot("--cores", "1", "--idle-timeout", "3", "--report-timeout", LONG,
                          "--request-timeout", "5", "--keep-job-folders")
        grid.wait_status(job_id, {"Running"})
    # The matcher is gone; now the payload ends.
    (job_dir,) = (tmp_path / "work").glob(f"*{job_id}*")
    (job_dir / "go").touch()
    out, _ = proc.communicate(timeout=EXIT_WAIT)
    assert proc.returncode == 4, out
    assert "Traceback" not in out
    kept = json.loads((tmp_path / "work" / "undelivered-reports.json").read_text())
    final = [r for r in kept if r["status"] != "Running"]
    assert [(r["job_id"], r["status"], r["exit_code"]) for r in final] == [(job_id, "Done", 0)]
    assert "has not answered for 3 s" in out, out[-3000:]


def test_a_pilot_a_test_leaves_running_is_ended_with_its_payload(tmp_path: Path) -> None:
    """What the integration tests' autouse fixture does after each test."""
    pid_file = tmp_path / "payload.pid"
    server = HangingMatcher({"job_id": 8, "vo": "lhcb", "owner": "alice",
                             "owner_group": "lhcb_user", "job_type": "User",
                             "executable": "/bin/sh",
                             "arguments": ["-c", f"echo $$ > {pid_file}; exec sleep 600"]})
    try:
        token_file = write_token_file(tmp_path / "pilot.token", "a.b.c")
        proc = start_pilot(
            [sys.executable, "-m", "pilot.cli", "--matcher", server.url, "--vo", "lhcb",
             "--workdir", str(tmp_path / "work"), "--token-file", str(token_file),
             "--cores", "1", "--grace", "2", "--idle-timeout", LONG],
            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + EXIT_WAIT
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        payload = payload_of(proc, tmp_path / "work" / "job_8")
        assert stop_started_pilots() == [proc.pid]
    finally:
        server.close()
    assert proc.returncode is not None
    assert running(payload) == []
    assert stop_started_pilots() == []


def test_a_pilot_whose_matcher_is_gone_stops_its_payload_and_exits(tmp_path: Path) -> None:
    """A pilot that lost its matcher mid-payload does not run on for the payload's life (the
    matcher reschedules a silent job elsewhere): the payload is stopped, its job reported
    Rescheduled in the file for --replay."""
    url = f"sqlite:///{tmp_path / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    pid_file = tmp_path / "payload.pid"
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", tmp_path) as base:
        grid = Grid(base, tmp_path)
        jdl = (f'[ Executable = "/bin/sh"; Arguments = "-c \'echo $$ > {pid_file}; exec sleep '
               f'600\'"; CPUTime = 600 ]')
        answer = grid.user.post(f"{base}/api/v1/jobs", data=jdl.encode(), timeout=30,
                                headers={"Content-Type": "text/plain"})
        assert answer.status_code == 201, answer.text
        (job_id,) = answer.json()["job_ids"]
        proc = grid.pilot("--cores", "1", "--idle-timeout", "3", "--report-timeout", LONG,
                          "--request-timeout", "5")
        grid.wait_status(job_id, {"Running"})
        deadline = time.monotonic() + EXIT_WAIT
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        payload = payload_of(proc, tmp_path / "work" / f"job_{job_id}")
    out, _ = proc.communicate(timeout=EXIT_WAIT)
    assert proc.returncode == 4, out
    assert running(payload) == []
    kept = json.loads((tmp_path / "work" / "undelivered-reports.json").read_text())
    assert [(r["job_id"], r["status"]) for r in kept] == [(job_id, "Rescheduled")], kept
    assert "has not answered for 3 s" in kept[0]["minor_status"]
