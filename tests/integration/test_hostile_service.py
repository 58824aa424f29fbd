"""The user's client and the pilot against a service that misbehaves on purpose (a real
server on loopback): answers trickled a byte at a time, answers without end, answers of the
wrong shape, redirects to another host. Each ends with a one-line reason and a non-zero exit,
never a traceback, never a hang."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from pilot import transfer
from tests.helpers import write_token_file

Answer = Callable[[str], "Reply"]


class Reply:
    """What the server sends: ``head`` at once, then ``body`` (``trickle``: a byte every
    0.3 s, for ever; ``endless``: zeros as fast as they go, for ever)."""

    def __init__(self, head: bytes, body: bytes = b"", mode: str = "once") -> None:
        self.head, self.body, self.mode = head, body, mode


def json_reply(data: object, status: str = "200 OK") -> Reply:
    body = json.dumps(data).encode()
    return Reply(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: "
                 f"{len(body)}\r\nConnection: close\r\n\r\n".encode(), body)


def redirect_reply(location: str) -> Reply:
    return Reply(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\n"
                 "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())


TRICKLED_HEADERS = Reply(b"", b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"X-Padding: " + b"x" * 10_000, "trickle")
TRICKLED_BODY = Reply(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100000\r\nConnection: close\r\n\r\n",
                      b'{"jobs": [' + b" " * 99_990, "trickle")
ENDLESS = Reply(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                b"\r\n", b"", "endless")


class Hostile:
    """A loopback HTTP server answering each request with ``answer(path)``; it counts the
    requests it receives."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.finished.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = conn.recv(65536).decode("latin-1")
                path = request.split(" ", 2)[1] if request.count(" ") >= 2 else "/"
                self.requests.append(path)
                reply = self.answer(path)
                conn.sendall(reply.head)
                if reply.mode == "once":
                    conn.sendall(reply.body)
                elif reply.mode == "trickle":
                    i = 0
                    while not self.finished.is_set():
                        conn.sendall(reply.body[i % len(reply.body):][:1])
                        i += 1
                        time.sleep(0.3)
                else:
                    zeros = bytes(1024 * 1024)
                    while not self.finished.is_set():
                        conn.sendall(zeros)
            except OSError:
                return

    def close(self) -> None:
        self.finished.set()
        self.listener.close()
        self.thread.join()


@pytest.fixture()
def serve() -> Iterator[Callable[[Answer], Hostile]]:
    servers: list[Hostile] = []

    def start(answer: Answer) -> Hostile:
        servers.append(Hostile(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


# -- the transport ---------------------------------------------------------------------------


@pytest.mark.parametrize("reply", [TRICKLED_HEADERS, TRICKLED_BODY], ids=["headers", "body"])
def test_a_trickled_answer_is_given_up_at_the_deadline(
        serve: Callable[[Answer], Hostile], reply: Reply) -> None:
    server = serve(lambda path: reply)
    with pytest.raises(transfer.DeadlineError, match="no complete answer within 1 s"):
        transfer.request(requests.Session(), "GET", server.url + "/x", deadline=1.0)


def test_an_endless_answer_is_read_up_to_the_cap(serve: Callable[[Answer], Hostile]) -> None:
    server = serve(lambda path: ENDLESS)
    with pytest.raises(transfer.AnswerTooLargeError, match="larger than 5000000 bytes"):
        transfer.request(requests.Session(), "GET", server.url + "/x", deadline=60,
                         max_bytes=5_000_000)
    declared = serve(lambda path: Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 999999999\r\n"
                                        b"\r\n"))
    with pytest.raises(transfer.AnswerTooLargeError):
        transfer.request(requests.Session(), "GET", declared.url, deadline=60, max_bytes=1000)


def test_redirects_stay_at_the_services_origin(serve: Callable[[Answer], Hostile]) -> None:
    elsewhere = serve(lambda path: json_reply({"stolen": True}))
    home = serve(lambda path: redirect_reply("/there") if path == "/here"
                 else redirect_reply(elsewhere.url + "/x") if path == "/away"
                 else json_reply({"path": path}))
    session = requests.Session()
    followed = transfer.request(session, "POST", home.url + "/here", deadline=10,
                                json={"a": 1})
    assert followed.json() == {"path": "/there"}
    with pytest.raises(transfer.RedirectRefusedError, match="away from the service"):
        transfer.request(session, "POST", home.url + "/away", deadline=10, json={"a": 1})
    assert elsewhere.requests == []


# -- the user's client -----------------------------------------------------------------------


def _client(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).with_name("gridpilot-client")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDPILOT_")}
    env.update(GRIDPILOT_URL=url, GRIDPILOT_TOKEN="a.b.c", XDG_CONFIG_HOME=str(tmp_path))
    return subprocess.run([str(command), "--timeout", "2", *args], capture_output=True,
                          text=True, env=env, timeout=120, check=False)


def _one_line_failure(ran: subprocess.CompletedProcess[str]) -> str:
    assert ran.returncode != 0, ran.stdout
    assert "Traceback" not in ran.stderr, ran.stderr
    lines = [line for line in (ran.stdout + ran.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("reply", [TRICKLED_HEADERS, TRICKLED_BODY], ids=["headers", "body"])
def test_the_client_gives_a_trickling_service_up_at_its_timeout(
        serve: Callable[[Answer], Hostile], tmp_path: Path, reply: Reply) -> None:
    server = serve(lambda path: reply)
    line = _one_line_failure(_client(server.url, tmp_path, "whoami"))
    assert "no complete answer within 2 s" in line


def test_the_client_stops_reading_an_endless_answer(serve: Callable[[Answer], Hostile],
                                                    tmp_path: Path) -> None:
    server = serve(lambda path: ENDLESS)
    assert "larger than" in _one_line_failure(_client(server.url, tmp_path, "whoami"))


@pytest.mark.parametrize(("args", "answer"), [
    (("list",), {"jobs": "not a list"}),
    (("list",), {"no": "jobs"}),
    (("list",), {"jobs": [1, 2]}),
    (("status", "1"), {"id": "x"}),
    (("whoami",), {}),
    (("whoami",), {"subject": ["alice"]}),
    (("kill", "1"), {"jobs": None}),
])
def test_the_client_refuses_wrong_shaped_answers_in_one_line(
        serve: Callable[[Answer], Hostile], tmp_path: Path, args: tuple[str, ...],
        answer: object) -> None:
    server = serve(lambda path: json_reply(answer))
    line = _one_line_failure(_client(server.url, tmp_path, *args))
    assert "unexpected answer" in line, line


def test_the_client_does_not_follow_a_redirect_to_another_host(
        serve: Callable[[Answer], Hostile], tmp_path: Path) -> None:
    elsewhere = serve(lambda path: json_reply({"subject": "mallory"}))
    server = serve(lambda path: redirect_reply(elsewhere.url + path))
    description = tmp_path / "job.json"
    description.write_text('{"Executable": "/bin/true"}')
    for args in (("whoami",), ("submit", str(description))):
        assert "away from the service" in _one_line_failure(_client(server.url, tmp_path,
                                                                    *args))
    assert elsewhere.requests == []


# -- the pilot -------------------------------------------------------------------------------


def _pilot(url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    token_file = write_token_file(tmp_path / "pilot.token", "a.b.c")
    return subprocess.run(
        [sys.executable, "-m", "pilot.cli", "--matcher", url, "--vo", "lhcb",
         "--workdir", str(tmp_path / "work"), "--token-file", str(token_file),
         "--idle-timeout", "3", "--backoff-cap", "0.5", "--report-timeout", "1",
         "--request-timeout", "2"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)


@pytest.mark.parametrize("answer", [
    lambda path, other: json_reply({"jobs": "nope"}),
    lambda path, other: json_reply(["a list"]),
    lambda path, other: redirect_reply(other + path),
    lambda path, other: ENDLESS,
    lambda path, other: TRICKLED_BODY,
], ids=["wrong shape", "not an object", "redirect away", "endless", "trickled"])
def test_a_pilot_that_never_gets_a_readable_answer_exits_5(
        serve: Callable[[Answer], Hostile], tmp_path: Path,
        answer: Callable[[str, str], Reply]) -> None:
    elsewhere = serve(lambda path: json_reply({"jobs": []}))
    server = serve(lambda path: answer(path, elsewhere.url))
    ran = _pilot(server.url, tmp_path)
    assert ran.returncode == 5, ran.stderr[-3000:]
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith(f"gridpilot-pilot: exit 5: the matcher at {server.url} never "
                           "gave a readable answer"), last
    assert elsewhere.requests == []


GOOD_JOB = {"job_id": 7, "vo": "lhcb", "owner": "alice", "owner_group": "lhcb_user",
            "job_type": "User", "executable": "/bin/true"}


@pytest.mark.parametrize("match", [
    {"jobs": "nope"},
    {"jobs": [], "no_match": "busy"},
    {"jobs": [{**GOOD_JOB, "job_id": "seven"}]},
    {"jobs": [{**GOOD_JOB, "arguments": "not a list"}]},
    {"jobs": [{**GOOD_JOB, "environment": ["A=1"]}]},
    {"jobs": [{**GOOD_JOB, "processors": True}]},
], ids=["jobs not a list", "no_match not an object", "job id not a number",
        "arguments not a list", "environment not an object", "processors not a number"])
def test_a_registered_pilot_fed_wrong_shaped_match_answers_exits_5(
        serve: Callable[[Answer], Hostile], tmp_path: Path, match: object) -> None:
    """Issue 33 item 10: a pilot at a site, whose registration and SubmitPools were answered
    (the SubmitPools in 1 s), exited 0 after its idle timeout when every match answer had the
    wrong shape (its idle time started before its first match request failed)."""
    def answer(path: str) -> Reply:
        if path.startswith("/api/v1/pilots/match"):
            return json_reply(match)
        if path.startswith("/api/v1/pilots/submitpools"):
            time.sleep(1)
            return json_reply({"submit_pools": []})
        return json_reply({})  # the registration: any object will do

    server = serve(answer)
    token_file = write_token_file(tmp_path / "pilot.token", "a.b.c")
    ran = subprocess.run(
        [sys.executable, "-m", "pilot.cli", "--matcher", server.url, "--vo", "lhcb",
         "--site", "DIRAC.Demo.local", "--ce", "localhost", "--queue", "local",
         "--workdir", str(tmp_path / "work"), "--token-file", str(token_file),
         "--idle-timeout", "3", "--backoff-cap", "0.5", "--report-timeout", "1",
         "--request-timeout", "2"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert ran.returncode == 5, ran.stderr[-3000:]
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith(f"gridpilot-pilot: exit 5: the matcher at {server.url} gave no "
                           "readable answer to a match request"), last
    assert "Traceback" not in ran.stderr
    assert any(p.startswith("/api/v1/pilots/match") for p in server.requests)
    assert not (tmp_path / "work" / "7").exists()
