"""Sandboxes end to end: a user uploads input files, a real pilot subprocess fetches and
unpacks them before the payload, packs and uploads its output afterwards, and the user reads
the output back through the API; on every database, against a real matcher on loopback."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gridpilot.devserver import free_port, matcher_server
from matcher.auth import issue_token
from pilot.archive import Member, pack, unpack
from taskqueue.core.settings import SandboxSettings
from taskqueue.files.sandboxstore import S3Store
from tests.conftest import Database
from tests.helpers import write_token_file

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sandbox-integration-secret-0123456789"
SITE, CE, QUEUE = "DIRAC.Demo.local", "localhost", "local"
RUN = b"""#!/bin/sh
cat data.txt
tr a-z A-Z < data.txt > out.txt
echo "to stderr" >&2
"""


class User:
    def __init__(self, base: str, subject: str = "alice") -> None:
        self.base = base
        self.http = requests.Session()
        self.http.headers["Authorization"] = "Bearer " + issue_token(
            SECRET, subject=subject, role="user", vo="lhcb", group="lhcb_user", lifetime=3600)

    def upload(self, data: bytes) -> str:
        answer = self.http.post(f"{self.base}/api/v1/sandboxes", json={
            "checksum": hashlib.sha256(data).hexdigest(), "size": len(data)}, timeout=30)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        if not body["uploaded"]:
            url = body["upload"]["url"]
            ours = url.startswith(self.base)
            http = self.http if ours else requests.Session()  # presigned: no token
            put = http.put(url, data=data, headers=body["upload"]["headers"], timeout=30)
            assert put.status_code == (201 if ours else 200), put.text
            if not ours:
                again = self.http.post(f"{self.base}/api/v1/sandboxes", json={
                    "checksum": hashlib.sha256(data).hexdigest(), "size": len(data)},
                    timeout=30)
                assert again.json()["uploaded"] is True, again.text
        sid: str = body["sandbox_id"]
        return sid

    def submit(self, jdl: str) -> int:
        response = self.http.post(f"{self.base}/api/v1/jobs", data=jdl.encode(),
                                  headers={"Content-Type": "text/plain"}, timeout=30)
        assert response.status_code == 201, response.text
        job_id: int = response.json()["job_ids"][0]
        return job_id

    def get(self, path: str) -> Any:
        response = self.http.get(f"{self.base}/api/v1{path}", timeout=30)
        assert response.status_code == 200, response.text
        return response.json()

    def download(self, sid: str) -> bytes:
        response = self.http.get(f"{self.base}/api/v1/sandboxes/{sid}", timeout=30,
                                 allow_redirects=False)
        if response.status_code == 307:  # from the object store
            response = requests.get(response.headers["Location"], timeout=30)
        assert response.status_code == 200, response.text
        return response.content


def run_pilot(base: str, tmp: Path, *args: str) -> subprocess.Popen[str]:
    token = issue_token(SECRET, subject="pilots", role="pilot", vo="lhcb", group="lhcb_pilot",
                        lifetime=3600, site=SITE)
    token_file = write_token_file(tmp / "pilot.token", token)
    env = dict(os.environ)
    env.pop("MACHINEFEATURES", None)
    env.pop("JOBFEATURES", None)
    return subprocess.Popen(
        [sys.executable, "-m", "pilot.cli", "--matcher", base, "--token-file", str(token_file),
         "--vo", "lhcb", "--site", SITE,
         "--ce", CE, "--queue", QUEUE, "--workdir", str(tmp / "work"), "--cores", "1",
         "--heartbeat", "0.5", "--grace", "2", "--backoff-cap", "1", "--margin", "0",
         "--idle-timeout", "2", *args],
        env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return out


@pytest.fixture()
def server(db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("GRIDPILOT_SANDBOXES_DIRECTORY", str(tmp_path / "sandboxes"))
    with matcher_server(db.url, SECRET, ROOT / "conf" / "resources.toml", tmp_path) as base:
        yield base


@pytest.fixture(params=["local", "s3"])
def any_store_server(request: pytest.FixtureRequest, db: Database, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The matcher with each sandbox store: a local folder, or a bucket on the moto server."""
    monkeypatch.setenv("GRIDPILOT_SANDBOXES_DIRECTORY", str(tmp_path / "sandboxes"))
    if request.param == "s3":
        endpoint = request.getfixturevalue("moto_endpoint")
        bucket = f"pilot-{uuid.uuid4().hex[:12]}"
        for key, value in (("BACKEND", "s3"), ("ENDPOINT_URL", endpoint), ("BUCKET", bucket)):
            monkeypatch.setenv(f"GRIDPILOT_SANDBOXES_{key}", value)
        S3Store(SandboxSettings(backend="s3", endpoint_url=endpoint,
                                bucket=bucket)).ensure_bucket()
    with matcher_server(db.url, SECRET, ROOT / "conf" / "resources.toml", tmp_path) as base:
        yield base


def test_input_and_output_sandboxes_round_trip_through_a_real_pilot(any_store_server: str,
                                                                    tmp_path: Path) -> None:
    server = any_store_server
    alice = User(server)
    sid = alice.upload(pack([Member("run.sh", RUN, executable=True),
                             Member("data.txt", b"hello grid\n")]))
    job_id = alice.submit(f'[Executable = "/bin/sh"; Arguments = "run.sh"; '
                          f'InputSandbox = {{"{sid}"}}; StdError = "std.err"; '
                          f'OutputSandbox = {{"out.txt", "missing.txt"}}]')
    out = finish(run_pilot(server, tmp_path))
    job = alice.get(f"/jobs/{job_id}")
    assert job["status"] == "Done", out
    assert "missing.txt" in job["minor_status"]
    answer = alice.get(f"/jobs/{job_id}/output")
    assert answer["input_sandboxes"] == [sid]
    assert answer["output_sandbox"]
    unpack(alice.download(answer["output_sandbox"]), tmp_path / "back")
    assert (tmp_path / "back" / "out.txt").read_text() == "HELLO GRID\n"
    assert (tmp_path / "back" / "output.log").read_text() == "hello grid\n"
    assert (tmp_path / "back" / "std.err").read_text() == "to stderr\n"
    # Another user cannot read it.
    bob = User(server, "bob").http.get(
        f"{server}/api/v1/sandboxes/{answer['output_sandbox']}", timeout=30,
        allow_redirects=False)
    assert bob.status_code == 404


def test_the_pilot_confirms_a_job_before_it_downloads_the_input_sandbox(
        server: str, tmp_path: Path) -> None:
    # A Matched job its pilot has not confirmed goes back to its task queue after
    # [agents] matched_lease (120 s): a pilot fetching a large input sandbox first would lose
    # the job it is preparing. It says Running before the download, then again once the
    # payload starts.
    alice = User(server)
    sid = alice.upload(pack([Member("data.txt", b"hello grid\n")]))
    job_id = alice.submit(f'[Executable = "/bin/cat"; Arguments = "data.txt"; '
                          f'InputSandbox = {{"{sid}"}}]')
    out = finish(run_pilot(server, tmp_path))
    job = alice.get(f"/jobs/{job_id}")
    assert job["status"] == "Done", out
    steps = [(h["status"], h["minor_status"]) for h in job["history"]]
    matched = steps.index(next(s for s in steps if s[0] == "Matched"))
    assert steps[matched + 1:matched + 3] == [("Running", "Input sandbox download"),
                                              ("Running", "Application started")], steps


def test_a_job_without_input_sandbox_is_confirmed_when_it_starts(server: str,
                                                                 tmp_path: Path) -> None:
    alice = User(server)
    job_id = alice.submit('[Executable = "/bin/true"]')
    out = finish(run_pilot(server, tmp_path))
    job = alice.get(f"/jobs/{job_id}")
    assert job["status"] == "Done", out
    assert [h["minor_status"] for h in job["history"] if h["status"] == "Running"] == [
        "Application started"]


def _hostile() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    return gzip.compress(raw.getvalue())


def test_an_unsafe_input_sandbox_fails_the_job_and_writes_nothing_outside(
        server: str, tmp_path: Path) -> None:
    alice = User(server)
    sid = alice.upload(_hostile())
    job_id = alice.submit(f'[Executable = "/bin/true"; InputSandbox = {{"{sid}"}}]')
    finish(run_pilot(server, tmp_path))
    job = alice.get(f"/jobs/{job_id}")
    assert job["status"] == "Failed"
    assert "Input sandbox" in job["minor_status"] and "leaves its folder" in \
        job["minor_status"]
    assert not (tmp_path / "work" / "escaped.txt").exists()
    assert not (tmp_path / "escaped.txt").exists()


def test_an_output_over_the_upload_limit_still_reports_the_final_status(
        db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRIDPILOT_SANDBOXES_DIRECTORY", str(tmp_path / "sandboxes"))
    monkeypatch.setenv("GRIDPILOT_SANDBOXES_MAX_UPLOAD_BYTES", "2000")
    with matcher_server(db.url, SECRET, ROOT / "conf" / "resources.toml", tmp_path) as base:
        alice = User(base)
        job_id = alice.submit('[Executable = "/bin/sh"; Arguments = "-c \'head -c 100000 '
                              '/dev/urandom > big.bin; echo done\'"; '
                              'OutputSandbox = {"big.bin"}]')
        finish(run_pilot(base, tmp_path))
        job = alice.get(f"/jobs/{job_id}")
        assert job["status"] == "Done"
        assert "Output sandbox refused" in job["minor_status"]
        assert alice.get(f"/jobs/{job_id}/output")["output_sandbox"] is None


def test_the_output_upload_waits_for_a_matcher_that_is_down(db: Database, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv("GRIDPILOT_SANDBOXES_DIRECTORY", str(tmp_path / "sandboxes"))
    port = free_port()
    resources = ROOT / "conf" / "resources.toml"
    with matcher_server(db.url, SECRET, resources, tmp_path, port=port) as base:
        alice = User(base)
        job_id = alice.submit('[Executable = "/bin/sh"; Arguments = "-c \'sleep 3; '
                              'echo result > out.txt\'"; OutputSandbox = {"out.txt"}]')
        # A matcher silent for longer than --idle-timeout ends the pilot: the outage below
        # stays shorter.
        proc = run_pilot(base, tmp_path, "--report-timeout", "120", "--idle-timeout", "20")
        deadline = time.monotonic() + 60
        while alice.get(f"/jobs/{job_id}")["status"] != "Running":
            assert time.monotonic() < deadline
            time.sleep(0.2)
    # The matcher is down when the payload ends: the upload and the report wait for it.
    time.sleep(5)
    assert proc.poll() is None
    with matcher_server(db.url, SECRET, resources, tmp_path, port=port):
        finish(proc)
        answer = alice.get(f"/jobs/{job_id}/output")
        assert answer["status"] == "Done" and answer["output_sandbox"]
        unpack(alice.download(answer["output_sandbox"]), tmp_path / "back")
    assert (tmp_path / "back" / "out.txt").read_text() == "result\n"
