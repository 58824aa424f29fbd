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


class Unavailable:
    """A loopback HTTP server answering 503 with ``Retry-After`` (or without, or 429) the
    first ``times`` requests, then as a gridpilot service does; records each request."""

    def __init__(self, times: int, *, status: int = 503, retry_after: str | None = "1"
                 ) -> None:
        self.times = times
        self.status = status
        self.retry_after = retry_after
        self.requests: list[str] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            if self.stop.is_set():
                conn.close()
                return
            with conn:
                head = _read_request(conn)
                if not head:
                    continue
                self.requests.append(head.split(b" ", 2)[0].decode())
                if len(self.requests) <= self.times:
                    body = json.dumps({"title": "Service Unavailable", "status": self.status,
                                       "detail": "the database did not answer in time"}
                                      ).encode()
                    status = (b"HTTP/1.1 %d Unavailable\r\n" % self.status
                              + (b"Retry-After: %s\r\n" % self.retry_after.encode()
                                 if self.retry_after is not None else b""))
                else:
                    body = json.dumps(WHOAMI).encode()
                    status = b"HTTP/1.1 200 OK\r\n"
                conn.sendall(status + b"Content-Type: application/json\r\nConnection: close"
                             b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    def close(self) -> None:
        self.stop.set()
        socket.create_connection(self.listener.getsockname(), timeout=30).close()
        self.thread.join(timeout=30)
        self.listener.close()


@pytest.fixture()
def unavailable(request: pytest.FixtureRequest) -> Iterator[Unavailable]:
    server = Unavailable(**request.param)
    yield server
    server.close()


@pytest.mark.parametrize("unavailable", [{"times": 2}, {"times": 1, "status": 429}],
                         indirect=True)
def test_a_read_waits_out_a_service_that_says_when_to_come_back(
        unavailable: Unavailable) -> None:
    assert Service(unavailable.url, "t", timeout=30).whoami() == WHOAMI
    assert unavailable.requests == ["GET"] * (unavailable.times + 1)


@pytest.mark.parametrize("unavailable", [{"times": 1}], indirect=True)
def test_a_change_is_never_sent_twice_by_itself(unavailable: Unavailable) -> None:
    with pytest.raises(ServiceError) as caught:
        Service(unavailable.url, "t", timeout=30).kill_pilot("p-1")
    assert caught.value.status == 503
    assert caught.value.detail == "the database did not answer in time"
    assert unavailable.requests == ["POST"]


@pytest.mark.parametrize("unavailable", [{"times": 100}], indirect=True)
def test_a_read_gives_up_after_its_wait_with_the_services_reason(
        unavailable: Unavailable) -> None:
    with pytest.raises(ServiceError) as caught:
        Service(unavailable.url, "t", timeout=30, unavailable_wait=2.5).whoami()
    assert caught.value.status == 503
    assert caught.value.detail == "the database did not answer in time"
    assert unavailable.requests == ["GET"] * 3  # at 0, 1 and 2 s; a wait to 3 s is too long


@pytest.mark.parametrize("unavailable", [{"times": 1, "retry_after": None},
                                         {"times": 1, "retry_after": "soon"}], indirect=True)
def test_an_unavailable_answer_that_does_not_say_when_is_the_error(
        unavailable: Unavailable) -> None:
    with pytest.raises(ServiceError) as caught:
        Service(unavailable.url, "t", timeout=30).whoami()
    assert caught.value.status == 503
    assert unavailable.requests == ["GET"]
