"""A CE that misbehaves on purpose: a real HTTPS (or plain HTTP) server on loopback, written
here, answering each request as the test says (trickled, flooded, late, redirected), and
keeping the requests it received. Used by the tests of the ARC client against hostile CEs and
of the agents beside a slow CE."""

from __future__ import annotations

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

from agents.ce.arcrest import ArcRestClient
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
    #: Seconds waited before anything is sent (a CE slow to answer, within the deadline).
    delay: float = 0.0


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


def _read_request(conn: socket.socket) -> tuple[str, bytes]:
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
    return head.decode("latin-1"), body


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
                request, body = _read_request(conn)
                method, path = [*request.split(" ", 2), "", ""][:2]
                self.requests.append(f"{method} {path}")
                # An answer that reads the request's body has a with_body(method, path, body).
                with_body = getattr(self.answer, "with_body", None)
                answer = (with_body(method, path, body) if with_body is not None
                          else self.answer(method, path))
                if answer.delay:
                    self.finished.wait(answer.delay)
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
