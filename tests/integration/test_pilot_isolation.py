"""Two users' jobs side by side on one two-core pilot: bob's job keeps a secret in its folder;
alice's job looks for it where it could know to look (the pilot's work folder, the other job
folders, /tmp, the folders of the processes it can see) and signals the processes of other
jobs it can see. With the pilot's default isolation (bubblewrap here) it finds and signals
nothing; run bare (``--isolation none``) it finds both, which shows the test can fail."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import requests

from matcher.auth import issue_token
from pilot.archive import Member, pack
from pilot.client import MatcherClient
from tests.integration import test_sandboxes_pilot
from tests.integration.test_sandboxes_pilot import SECRET, User, finish, run_pilot

#: A matcher on loopback with a local sandbox store, on the test database.
server = test_sandboxes_pilot.server
#: The payloads' Python: the system's, which a sandbox with no shared area shows (this
#: Python's folder may be where the sandbox hides things: a checkout under /tmp).
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").is_file() else sys.executable

BOB = b'''\
import time
with open("secret.txt", "w") as f:
    f.write("bob-secret-0451")
time.sleep(15)
print("bob done")
'''

ALICE = b'''\
import os
me = os.environ["GRIDPILOT_JOB_ID"]
here = os.getcwd()
found, signalled = set(), set()
def look(folder):
    path = os.path.join(folder, "secret.txt")
    try:
        with open(path) as f:
            if "bob-secret" in f.read():
                found.add(path)
    except OSError:
        pass
workdir = os.path.dirname(here)
for top in (workdir, os.path.dirname(workdir), "/tmp"):
    for folder, _, _ in os.walk(top):
        look(folder)
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    try:
        with open(f"/proc/{name}/environ", "rb") as f:
            env = f.read().split(b"\\0")
    except OSError:
        continue
    ids = [e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"GRIDPILOT_JOB_ID=")]
    if ids and ids[0] != me:
        look(f"/proc/{name}/cwd")
        try:
            os.kill(int(name), 0)
            signalled.add(name)
        except OSError:
            pass
print("secrets found", len(found), sorted(found))
print("processes of other jobs signalled", len(signalled))
'''


def _wait(what: str, ready: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.parametrize("isolation", ["default", "none"])
def test_a_payload_finds_and_signals_nothing_of_another_users_payload(
        server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolation: str) -> None:
    # The pilot's defaults: no shared area shown to payloads.
    monkeypatch.delenv("GRIDPILOT_ISOLATION_BIND", raising=False)
    monkeypatch.delenv("GRIDPILOT_ISOLATION", raising=False)
    alice, bob = User(server), User(server, "bob")
    bob_box = bob.upload(pack([Member("bob.py", BOB)]))
    bob_job = bob.submit(f'[Executable = "{PYTHON}"; Arguments = "bob.py"; '
                         f'InputSandbox = {{"{bob_box}"}}]')
    args = ["--cores", "2", "--idle-timeout", "5"]
    proc = run_pilot(server, tmp_path, *args,
                     *(["--isolation", "none"] if isolation == "none" else []))
    secret = tmp_path / "work" / f"job_{bob_job}" / "secret.txt"
    _wait("bob's secret", secret.exists)
    alice_box = alice.upload(pack([Member("alice.py", ALICE)]))
    alice_job = alice.submit(f'[Executable = "{PYTHON}"; Arguments = "alice.py"; '
                             f'InputSandbox = {{"{alice_box}"}}]')
    _wait("alice's job to end", lambda: alice.get(f"/jobs/{alice_job}")["status"]
          in ("Done", "Failed"))
    # Side by side: bob's job still runs when alice's has ended.
    assert bob.get(f"/jobs/{bob_job}")["status"] == "Running"
    out = finish(proc)
    assert alice.get(f"/jobs/{alice_job}")["status"] == "Done", out
    assert bob.get(f"/jobs/{bob_job}")["status"] == "Done", out
    tail = alice.get(f"/jobs/{alice_job}/output")["output_tail"]
    operator = {"Authorization": "Bearer " + issue_token(
        SECRET, subject="olga", role="operator", vo="lhcb", group="lhcb_admin",
        lifetime=3600)}
    reference = alice.get(f"/jobs/{alice_job}")["pilot_reference"]
    record = requests.get(f"{server}/api/v1/pilots/{reference}", headers=operator,
                          timeout=30).json()
    if isolation == "none":
        assert record["isolation"] == "none", record
        assert "secrets found 0" not in tail, tail
        assert "processes of other jobs signalled 0" not in tail, tail
        assert "WITHOUT ISOLATION" in out
    else:
        assert "secrets found 0 []" in tail, tail
        assert "processes of other jobs signalled 0" in tail, tail
        assert "payloads run isolated: bwrap" in out, out
        assert record["isolation"].startswith("bwrap "), record


class _OlderMatcher(BaseHTTPRequestHandler):
    """A matcher from before the registration's ``isolation`` field: its closed schema refuses
    the field (422), as the real one refused any unknown field."""

    bodies: ClassVar[list[dict[str, object]]] = []

    def do_PUT(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        if "isolation" in body:
            answer, status = {"title": "Unprocessable", "status": 422,
                              "detail": "body: unknown field 'isolation'"}, 422
        else:
            answer, status = {"reference": "p-1", **body}, 200
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_a_pilot_registers_with_a_matcher_that_does_not_know_the_field() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OlderMatcher)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = MatcherClient(f"http://127.0.0.1:{server.server_address[1]}", "a.b.c",
                               timeout=10)
        client.register("p-1", site="S", ce="C", queue="Q", status="Running",
                        isolation="bwrap 0.8.0")
    finally:
        server.shutdown()
        server.server_close()
    assert [b.get("isolation") for b in _OlderMatcher.bodies] == ["bwrap 0.8.0", None]
    assert _OlderMatcher.bodies[1] == {"site": "S", "ce": "C", "queue": "Q",
                                       "status": "Running"}
