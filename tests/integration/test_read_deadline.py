"""The request read deadline of ``gridpilot serve`` ([matcher] read_timeout), against a real
server (one gthread worker of four request threads, gridpilot.worker) and raw sockets.

Clients that send part of a request's head and then stop, or trickle it a byte at a time, each
hold a request thread while the worker reads their request: as many of them as there are
threads, and no other request was answered. The server now gives each request read_timeout
seconds from its first byte to its last: past that the connection is closed, the threads are
free again, and normal requests are answered. A kept-alive connection idle between two requests
is not counted against it (gunicorn's keepalive closes those, as before)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.integration.test_health_starvation import sqlite_matcher

SECRET = "read-deadline-test-secret-0123456789abcd"
#: The deadline the server is given, in seconds.
READ_TIMEOUT = 3.0
#: The request threads of the one worker ([matcher] threads' default).
THREADS = 4
#: Slack for a loaded test host, in seconds (without the deadline nothing is answered or
#: closed at all: a wide slack keeps the test's meaning).
SLACK = 5.0
HEAD = b"GET /api/v1/openapi.json HTTP/1.1\r\nHost: x\r\n"
#: gunicorn's keepalive (its default): how long a connection may idle between requests.
KEEPALIVE = 2.0


@pytest.fixture()
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("GRIDPILOT_MATCHER_READ_TIMEOUT", str(READ_TIMEOUT))
    monkeypatch.setenv("GRIDPILOT_MATCHER_THREADS", str(THREADS))
    with sqlite_matcher(tmp_path, SECRET) as base:
        yield base


def _address(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").split(":")
    return host, int(port)


def _closed_after(sock: socket.socket, started: float, limit: float) -> float | None:
    """Seconds from ``started`` until the server closed ``sock`` (None: still open after
    ``limit`` seconds from ``started``)."""
    while True:
        left = started + limit - time.monotonic()
        if left <= 0:
            return None
        sock.settimeout(left)
        try:
            data = sock.recv(4096)
        except TimeoutError:
            return None
        except ConnectionResetError:
            return time.monotonic() - started
        if not data:
            return time.monotonic() - started


def _trickle(sock: socket.socket, stop: threading.Event) -> None:
    try:
        sock.sendall(HEAD + b"X-Slow: ")
        while not stop.wait(0.3):
            sock.sendall(b"a")
    except OSError:
        pass  # closed by the server: as it should be


def test_stalled_requests_are_cut_at_the_deadline_and_others_answered(server: str) -> None:
    started = time.monotonic()
    stalled = [socket.create_connection(_address(server), timeout=5) for _ in range(THREADS)]
    stop = threading.Event()
    tricklers = [threading.Thread(target=_trickle, args=(sock, stop))
                 for sock in stalled[THREADS // 2:]]
    try:
        # Half stop after part of the head; the others send a header byte every 0.3 s, each
        # read well within any per-read timeout: only a deadline for the whole head cuts them.
        for sock in stalled[:THREADS // 2]:
            sock.sendall(HEAD)
        for thread in tricklers:
            thread.start()
        time.sleep(1)  # each connection is now with a request thread

        # Before the fix this request waited for as long as the stalled clients did.
        answer = requests.get(f"{server}/api/v1/openapi.json", timeout=READ_TIMEOUT + SLACK)
        assert answer.status_code == 200
        assert time.monotonic() - started < READ_TIMEOUT + SLACK

        for sock in stalled:
            closed = _closed_after(sock, started, READ_TIMEOUT + SLACK)
            assert closed is not None, "the server kept a stalled request's connection open"
            # Not cut before its deadline (they were opened within the first second).
            assert closed >= READ_TIMEOUT - 0.5, closed
    finally:
        stop.set()
        for thread in tricklers:
            if thread.ident is not None:
                thread.join(timeout=10)
        for sock in stalled:
            sock.close()


def _request(sock: socket.socket) -> bytes:
    """Send one request on ``sock`` and read its whole answer (Content-Length bytes)."""
    sock.sendall(HEAD + b"\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed a kept-alive connection within a request"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return head


def test_idle_time_between_kept_alive_requests_is_not_counted(server: str) -> None:
    with socket.create_connection(_address(server), timeout=READ_TIMEOUT + SLACK) as sock:
        started = time.monotonic()
        # Each pause is within keepalive; together they outlast the read deadline.
        while time.monotonic() - started < READ_TIMEOUT + 1:
            assert _request(sock).startswith(b"HTTP/1.1 200")
            time.sleep(KEEPALIVE * 0.6)
        assert _request(sock).startswith(b"HTTP/1.1 200")
        # Idle past keepalive: closed by keepalive as before (gunicorn checks it about once
        # a second).
        idle = time.monotonic()
        closed = _closed_after(sock, idle, KEEPALIVE + SLACK)
        assert closed is not None, "a kept-alive connection idle past keepalive stayed open"
        assert closed >= KEEPALIVE - 0.5, closed
