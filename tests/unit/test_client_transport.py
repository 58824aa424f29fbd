"""The client's transport: a name that does not resolve is named so, a refused connection is
told apart, and a kept-alive connection the service dropped under a request is retried once
on a new one (a real HTTP server on loopback)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from client.service import Service, ServiceError
from gridpilot.devserver import free_port


def test_a_name_that_does_not_resolve_is_named() -> None:
    with pytest.raises(ServiceError) as caught:
        Service("http://gridpilot.invalid:8080", "t", timeout=30).whoami()
    assert caught.value.status == 0
    assert caught.value.detail == ("cannot reach http://gridpilot.invalid:8080: the name "
                                   "gridpilot.invalid does not resolve (is the URL right?)")


def test_a_refused_connection_says_so() -> None:
    port = free_port()
    with pytest.raises(ServiceError) as caught:
        Service(f"http://127.0.0.1:{port}", "t", timeout=30).whoami()
    assert "connection refused or no route" in caught.value.detail


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    return data


#: What a gridpilot service answers to GET /whoami (the client checks its shape).
WHOAMI = {"subject": "alice", "role": "user", "vo": "lhcb", "group": "lhcb_user"}


@pytest.fixture()
def dropping_server() -> Iterator[tuple[str, list[str]]]:
    """Answers the first request on a connection and keeps it open; closes it unanswered when
    a second request comes on it, as a service closing an idle kept-alive connection does.
    Records what happened."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    events: list[str] = []
    body = json.dumps(WHOAMI).encode()
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)

    def handle(conn: socket.socket) -> None:
        with conn:
            if not _read_request(conn):
                return
            events.append("answered")
            conn.sendall(answer)
            if _read_request(conn):
                events.append("dropped")  # closed without an answer

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            if stop.is_set():
                conn.close()
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    stop = threading.Event()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", events
    finally:
        stop.set()
        socket.create_connection(listener.getsockname(), timeout=30).close()  # wakes accept
        thread.join(timeout=30)
        listener.close()


def test_a_dropped_kept_alive_connection_is_retried_once(
        dropping_server: tuple[str, list[str]]) -> None:
    url, events = dropping_server
    service = Service(url, "t", timeout=30)
    assert service.whoami() == WHOAMI
    assert service.whoami() == WHOAMI  # dropped, then answered anew
    service.http.close()
    assert events == ["answered", "dropped", "answered"]
