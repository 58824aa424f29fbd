"""Which connections gridpilot.worker sends to the thread kept for /healthz: decided from the
request line's first bytes, peeked on a real loopback connection without taking them and
without waiting."""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gridpilot.worker import asks_for_health


@dataclass
class Unreader:
    buf: io.BytesIO


@dataclass
class Parser:
    unreader: Unreader


@dataclass
class Connection:
    """The two attributes of gunicorn's connection that the routing reads."""
    sock: Any
    parser: Parser | None = None


@pytest.fixture()
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with client, server:
            yield client, server


def _sent(pair: tuple[socket.socket, socket.socket], data: bytes) -> socket.socket:
    client, server = pair
    client.sendall(data)
    deadline = time.monotonic() + 5
    while len(server.recv(len(data), socket.MSG_PEEK)) < len(data):
        assert time.monotonic() < deadline
    return server


@pytest.mark.parametrize("line", [b"GET /healthz HTTP/1.1\r\n", b"GET /healthz?x=1 HTTP/1.1\r\n",
                                  b"HEAD /healthz HTTP/1.0\r\n"])
def test_a_health_check_goes_to_the_kept_thread_and_keeps_its_bytes(
        pair: tuple[socket.socket, socket.socket], line: bytes) -> None:
    server = _sent(pair, line + b"Host: x\r\n\r\n")
    assert asks_for_health(Connection(server))
    assert server.recv(100) == line + b"Host: x\r\n\r\n"  # nothing was taken


@pytest.mark.parametrize("line", [b"GET /healthzz HTTP/1.1\r\n", b"GET /healthz/../api HTTP/1.1",
                                  b"POST /healthz HTTP/1.1\r\n", b"GET /api/v1/jobs HTTP/1.1\r\n",
                                  b"get /healthz HTTP/1.1\r\n", b"GET /heal",
                                  b"\x16\x03\x01\x02\x00\x01"])
def test_anything_else_goes_to_the_request_threads(pair: tuple[socket.socket, socket.socket],
                                                   line: bytes) -> None:
    assert not asks_for_health(Connection(_sent(pair, line)))


def test_a_connection_with_nothing_to_read_is_not_waited_for(
        pair: tuple[socket.socket, socket.socket]) -> None:
    _, server = pair
    started = time.monotonic()
    assert not asks_for_health(Connection(server))
    assert server.gettimeout() is None  # still a blocking socket, as gunicorn left it
    assert time.monotonic() - started < 1


def test_a_request_gunicorn_has_read_ahead_is_not_rerouted(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """The socket's next bytes are not the next request when gunicorn's buffer holds one."""
    server = _sent(pair, b"GET /healthz HTTP/1.1\r\n\r\n")
    read_ahead = Parser(Unreader(io.BytesIO(b"POST /api/v1/pilots/match HTTP/1.1\r\n")))
    assert not asks_for_health(Connection(server, read_ahead))
    assert asks_for_health(Connection(server, Parser(Unreader(io.BytesIO()))))


def test_a_closed_connection_goes_to_the_request_threads(
        pair: tuple[socket.socket, socket.socket]) -> None:
    _, server = pair
    server.close()
    assert not asks_for_health(Connection(server))
    assert not asks_for_health(Connection(None))


@pytest.mark.parametrize("data", [
    b"GET /healthz HTTP/1.1\r\n",  # the head not ended yet: a trickling client
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaa",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n",  # a body to wait for
    b"GET /healthz HTTP/1.1\r\nHost: x\r\ntransfer-encoding: chunked\r\n\r\n"])
def test_a_health_check_the_kept_thread_would_wait_for_goes_to_the_request_threads(
        pair: tuple[socket.socket, socket.socket], data: bytes) -> None:
    assert not asks_for_health(Connection(_sent(pair, data)))


def test_a_health_check_with_an_empty_body_goes_to_the_kept_thread(
        pair: tuple[socket.socket, socket.socket]) -> None:
    data = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    assert asks_for_health(Connection(_sent(pair, data)))
