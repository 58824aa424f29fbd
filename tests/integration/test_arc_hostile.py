"""The ARC REST client against a CE that misbehaves on purpose (a real HTTPS server on
loopback, written here): answers trickled a byte at a time, huge answers, gzip bombs,
redirects to another origin, malformed values. Each is that CE's ArcError, within the
client's deadline, and never reads more than the client's cap."""

from __future__ import annotations

import gzip
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.ce.arc import OUTPUT_FETCHES, ArcCE
from agents.ce.arcrest import ArcRefused, ArcRestClient, ArcUnavailable, ArcUnreachable
from agents.ce.base import CEPilot, CEUnavailable, PilotSpec
from agents.ce.config import CEConfig
from tests.helpers import write_token_file


@dataclass
class Reply:
    """What the server sends: ``head`` at once, then ``body``; ``trickle``: a byte every
    0.3 s, for at most ``seconds``; ``flood``: ``body`` over and over, ``seconds`` long or
    until 40 MB went out."""

    head: bytes
    body: bytes = b""
    mode: str = "once"
    seconds: float = 8.0


Answer = Callable[[str, str], Reply]

VERSIONS = b'{"version": "1.0"}'


def reply(body: bytes, *, status: str = "200 OK", extra: str = "") -> Reply:
    return Reply(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: "
                 f"{len(body)}\r\n{extra}Connection: close\r\n\r\n".encode(), body)


def _pki(folder: Path) -> tuple[Path, Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    done = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", "key.pem", "-out", "cert.pem", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        cwd=folder, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return folder / "cert.pem", folder / "cert.pem", folder / "key.pem"


def _read_request(conn: socket.socket) -> str:
    """The whole request, its body too: a server closing on unread data resets the
    connection, and the client would see that instead of the answer."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head.decode("latin-1")


class HostileCE:
    """A loopback server (HTTPS with ``context``, else plain HTTP) answering each request
    with ``answer(method, path)``; it keeps the requests it receives."""

    def __init__(self, answer: Answer, context: ssl.SSLContext | None) -> None:
        self.answer = answer
        self.context = context
        self.requests: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        port = self.listener.getsockname()[1]
        self.url = f"{'https' if context else 'http'}://127.0.0.1:{port}"
        self.finished = threading.Event()
        self.workers: list[threading.Thread] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.finished.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            worker = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self.workers.append(worker)
            worker.start()

    def _answer(self, raw: socket.socket) -> None:
        try:
            raw.settimeout(10)
            conn = self.context.wrap_socket(raw, server_side=True) if self.context else raw
            with conn:
                request = _read_request(conn)
                method, path = [*request.split(" ", 2), "", ""][:2]
                self.requests.append(f"{method} {path}")
                answer = self.answer(method, path)
                conn.sendall(answer.head)
                end = time.monotonic() + answer.seconds
                if answer.mode == "once":
                    conn.sendall(answer.body)
                elif answer.mode == "trickle":
                    for byte in answer.body:
                        if self.finished.is_set() or time.monotonic() > end:
                            break
                        conn.sendall(bytes([byte]))
                        time.sleep(0.3)
                else:
                    sent = 0
                    while (not self.finished.is_set() and time.monotonic() < end
                           and sent < 40_000_000):
                        conn.sendall(answer.body)
                        sent += len(answer.body)
        except OSError:
            return

    def close(self) -> None:
        self.finished.set()
        self.listener.close()
        self.thread.join()
        for worker in self.workers:
            worker.join(timeout=15)


@dataclass
class Lab:
    tmp: Path
    ca: Path
    context: ssl.SSLContext
    servers: list[HostileCE]

    def ce(self, answer: Answer, *, tls: bool = True) -> HostileCE:
        server = HostileCE(answer, self.context if tls else None)
        self.servers.append(server)
        return server

    def client(self, server: HostileCE, timeout: float = 2.0) -> ArcRestClient:
        token = write_token_file(self.tmp / "token", "a.b.c")
        return ArcRestClient(server.url + "/arex", token_file=token, ca_bundle=self.ca,
                             timeout=timeout)


@pytest.fixture()
def lab(tmp_path: Path) -> Iterator[Lab]:
    ca, cert, key = _pki(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    found = Lab(tmp_path, ca, context, [])
    yield found
    for server in found.servers:
        server.close()


def arex(jobs: Callable[[str, str], Reply]) -> Answer:
    """A CE answering its REST versions, and ``jobs`` for everything else."""
    def answer(method: str, path: str) -> Reply:
        if path.rstrip("/") == "/arex/rest":
            return reply(VERSIONS)
        return jobs(method, path)
    return answer


# -- one deadline for the whole exchange ---------------------------------------------------


def test_a_trickled_answer_ends_at_the_clients_deadline(lab: Lab) -> None:
    body = b'{"job": {"id": "a", "status-code": "201", "state": "RUNNING"}}' + b" " * 200
    trickled = Reply(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n", body,
                     "trickle")
    client = lab.client(lab.ce(arex(lambda method, path: trickled)), timeout=1.0)
    with pytest.raises(ArcUnreachable, match="no complete answer within 1 s"):
        client.statuses(["a"])


# -- bounded answers -------------------------------------------------------------------------


def test_a_huge_answer_is_not_read_past_the_cap(lab: Lab) -> None:
    flood = Reply(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\n\r\n", b" " * 65536, "flood")
    client = lab.client(lab.ce(arex(lambda method, path: flood)), timeout=30)
    with pytest.raises(ArcUnavailable, match="larger than 16777216 bytes"):
        client.statuses(["a"])


def test_a_gzip_bomb_is_not_decoded_past_the_cap(lab: Lab) -> None:
    bomb = gzip.compress(b" " * 64_000_000, compresslevel=9)
    assert len(bomb) < 200_000
    answer = reply(bomb, status="201 Created", extra="Content-Encoding: gzip\r\n")
    client = lab.client(lab.ce(arex(lambda method, path: answer)), timeout=30)
    with pytest.raises(ArcUnavailable, match="larger than 16777216 bytes"):
        client.statuses(["a"])


# -- redirects stay at the CE ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["other host", "plain http"])
def test_a_redirect_away_from_the_ce_is_not_followed(lab: Lab, where: str) -> None:
    elsewhere = lab.ce(lambda method, path: reply(
        b'{"job": {"id": "a", "status-code": "201", "state": "FINISHED"}}',
        status="201 Created"), tls=where == "other host")
    moved = Reply(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {elsewhere.url}/x\r\n"
                  "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
    client = lab.client(lab.ce(arex(lambda method, path: moved)))
    with pytest.raises(ArcRefused, match="away from the CE"):
        client.kill(["a"])
    assert elsewhere.requests == []


# -- malformed values are the CE's error ----------------------------------------------------


def test_a_listing_with_a_size_that_is_no_number_is_the_ces_error(lab: Lab) -> None:
    listing = (b'<?xml version="1.0"?><ListFilesResponse><file size="abc">pilot.out</file>'
               b"</ListFilesResponse>")
    client = lab.client(lab.ce(arex(lambda method, path: reply(listing))))
    with pytest.raises(ArcUnavailable, match="size 'abc', not a number"):
        client.session_files("a")


def test_a_content_range_that_is_no_size_is_the_ces_error(lab: Lab) -> None:
    client = lab.client(lab.ce(arex(lambda method, path: reply(
        b"x", status="206 Partial Content", extra="Content-Range: bytes 0-0/abc\r\n"))))
    with pytest.raises(ArcUnavailable, match="Content-Range 'bytes 0-0/abc'"):
        client.download("a", "pilot.out")


def test_an_exit_code_that_is_no_number_is_the_ces_error(lab: Lab) -> None:
    record = (b'{"job": {"id": "a", "status-code": "200", "info_document": {"ComputingActivity":'
              b' {"State": ["arcrest:FINISHED"], "ExitCode": "zero"}}}}')
    client = lab.client(lab.ce(arex(lambda method, path: reply(record, status="201 Created"))))
    with pytest.raises(ArcUnavailable, match="exit code 'zero', not a number"):
        client.infos(["a"])


# -- a CE that stops answering costs one deadline, not one per pilot -------------------------


def test_a_ce_that_stops_answering_mid_submission_is_waited_for_once(lab: Lab) -> None:
    created = b'{"job": [' + b", ".join(
        b'{"id": "j%d", "status-code": "201", "reason": "Created"}' % i for i in range(3)
    ) + b"]}"
    silence = Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b" " * 10, "trickle")

    def jobs(method: str, path: str) -> Reply:
        if method == "POST" and "action=new" in path:
            return reply(created, status="201 Created")
        if method == "PUT":
            return silence
        return reply(b"", status="500 Internal Server Error")  # clean, kill: broken too

    server = lab.ce(arex(jobs))
    token = write_token_file(lab.tmp / "token", "a.b.c")
    ce = ArcCE(CEConfig("arc", "arc", endpoint=server.url + "/arex", token_file=str(token),
                        ca_bundle=str(lab.ca)), timeout=1)
    specs = [PilotSpec(f"p{i}", "gridpilot-pilot", [], {}, token=f"t{i}") for i in range(3)]
    results = ce.submit(specs)
    assert [type(r) for r in results] == [CEUnavailable] * 3
    assert "no complete answer within 1 s" in str(results[0])
    # One upload waited for its deadline; the other pilots were not sent to the silent CE.
    assert sum(r.startswith("PUT ") for r in server.requests) == 1


def test_a_ce_that_stops_answering_while_outputs_are_fetched_is_waited_for_once(
        lab: Lab) -> None:
    silence = Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b" " * 10, "trickle")
    server = lab.ce(arex(lambda method, path: silence))
    token = write_token_file(lab.tmp / "token", "a.b.c")
    ce = ArcCE(CEConfig("arc", "arc", endpoint=server.url + "/arex", token_file=str(token),
                        ca_bundle=str(lab.ca)), timeout=1)
    pilots = [CEPilot(f"p{i}", f"j{i}") for i in range(5 * OUTPUT_FETCHES)]
    outputs = ce.outputs(pilots, 1024)
    assert [type(outputs[p.reference]) for p in pilots] == [CEUnavailable] * len(pilots)
    # The fetches under way when the CE fell silent waited for their deadline together; the
    # other pilots were not asked for.
    assert sum("/session/" in r for r in server.requests) <= OUTPUT_FETCHES
