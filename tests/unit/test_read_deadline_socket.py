"""gridpilot.worker.ReadDeadlineSocket on a real socket pair: the reads of one request share
one deadline from the first of them; past it a blocking read finds the end of the stream and
one with a timeout of its own raises, and a new request starts a new deadline."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from gridpilot.worker import ReadDeadlineSocket

SECONDS = 0.5


@pytest.fixture()
def pair() -> Iterator[tuple[ReadDeadlineSocket, socket.socket]]:
    server, client = socket.socketpair()
    sock = ReadDeadlineSocket.adopt(server, SECONDS)
    try:
        yield sock, client
    finally:
        sock.close()
        client.close()


def test_reads_of_one_request_share_one_deadline(
        pair: tuple[ReadDeadlineSocket, socket.socket]) -> None:
    sock, client = pair
    sock.begin()
    client.sendall(b"GET / HTTP/1.1\r\n")
    started = time.monotonic()
    assert sock.recv(100) == b"GET / HTTP/1.1\r\n"
    # A byte well within the deadline each time is read, but not past the whole deadline.
    while time.monotonic() - started < SECONDS - 0.2:
        client.sendall(b"a")
        assert sock.recv(100) == b"a"
        time.sleep(0.1)
    assert not sock.cut
    assert sock.recv(100) == b""
    waited = time.monotonic() - started
    assert sock.cut
    assert SECONDS - 0.05 <= waited < SECONDS + 0.5
    assert sock.gettimeout() is None  # blocking again, as gunicorn left it


def test_a_read_with_its_own_timeout_raises_past_the_deadline(
        pair: tuple[ReadDeadlineSocket, socket.socket]) -> None:
    sock, client = pair
    sock.begin()
    client.sendall(b"x")
    assert sock.recv(10) == b"x"
    sock.settimeout(5.0)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        sock.recv(10)
    assert time.monotonic() - started < SECONDS + 0.5
    assert sock.cut and sock.gettimeout() == 5.0
    # The caller's own shorter timeout is its own: not a cut.
    sock.begin()
    client.sendall(b"y")
    assert sock.recv(10) == b"y"
    sock.settimeout(0.1)
    with pytest.raises(TimeoutError):
        sock.recv(10)
    assert not sock.cut


def test_each_request_has_its_own_deadline_and_peeks_are_not_counted(
        pair: tuple[ReadDeadlineSocket, socket.socket]) -> None:
    sock, client = pair
    for _ in range(3):
        sock.begin()
        time.sleep(SECONDS / 2)  # idle before the request (keepalive's, not the deadline's)
        client.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert sock.recv(100, socket.MSG_PEEK) == b"GET / HTTP/1.1\r\n\r\n"
        time.sleep(SECONDS / 2)
        assert sock.recv(100) == b"GET / HTTP/1.1\r\n\r\n"
        assert not sock.cut
