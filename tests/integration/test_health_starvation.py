"""/healthz when the matcher's port is reached directly by clients that send slowly, against a
real ``gridpilot serve`` (one gthread worker of four request threads and the thread kept for
/healthz, gridpilot.worker), with raw sockets that trickle a request's head a byte at a time.

Trickled /healthz heads must not hold the kept thread (a balancer's check is still answered),
and request threads all held by such clients make /healthz fail, so that a balancer stops
sending work to an instance that cannot take it; it answers 200 again once they are gone."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from gridpilot import schema
from gridpilot.devserver import matcher_server
from taskqueue.db.database import make_engine

ROOT = Path(__file__).resolve().parents[2]
SECRET = "health-starvation-test-secret-0123456789"
#: Seconds between two trickled bytes: far below any read deadline in a single read.
TRICKLE = 0.3


@contextmanager
def sqlite_matcher(tmp_path: Path, secret: str) -> Iterator[str]:
    """``gridpilot serve`` (one worker) on a fresh SQLite database in ``tmp_path``, with the
    settings the environment gives; its base URL."""
    url = f"sqlite:///{tmp_path / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    work = tmp_path / "work"
    work.mkdir()
    with matcher_server(url, secret, ROOT / "conf" / "resources.toml", work,
                        workers=1) as base:
        yield base


@pytest.fixture()
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("GRIDPILOT_MATCHER_STARVED_AFTER", "2")
    with sqlite_matcher(tmp_path, SECRET) as base:
        yield base


@contextmanager
def trickling(base: str, head: bytes, count: int) -> Iterator[None]:
    """``count`` connections that send ``head`` and then one more header byte every TRICKLE
    seconds, never ending the head; all closed on leaving."""
    host, port = base.removeprefix("http://").split(":")
    stop = threading.Event()
    sockets = [socket.create_connection((host, int(port)), timeout=5) for _ in range(count)]

    def trickle(sock: socket.socket) -> None:
        try:
            sock.sendall(head + b"X-Slow: ")
            while not stop.wait(TRICKLE):
                sock.sendall(b"a")
        except OSError:
            pass  # the server gave up on it: as it should

    threads = [threading.Thread(target=trickle, args=(sock,)) for sock in sockets]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1)  # each connection is now with a thread of the worker
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        for sock in sockets:
            sock.close()


def test_trickled_health_checks_do_not_hold_the_kept_thread(server: str) -> None:
    with trickling(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", 2):
        for _ in range(3):
            # Before the fix each of these timed out behind the trickling connections.
            answer = requests.get(f"{server}/healthz", timeout=5)
            assert answer.status_code == 200, answer.text


def _health_until(server: str, status: int) -> requests.Response:
    deadline = time.monotonic() + 30
    while True:
        answer = requests.get(f"{server}/healthz", timeout=5)
        if answer.status_code == status:
            return answer
        assert time.monotonic() < deadline, f"/healthz kept answering {answer.status_code}"
        time.sleep(0.3)


def test_healthz_fails_while_every_request_thread_is_held(server: str) -> None:
    assert requests.get(f"{server}/healthz", timeout=5).status_code == 200
    with trickling(server, b"GET /api/v1/openapi.json HTTP/1.1\r\nHost: x\r\n", 4):
        # Before the fix /healthz kept answering 200 while no API request could be served.
        answer = _health_until(server, 503)
        assert answer.headers["Content-Type"] == "application/problem+json"
        assert "request threads" in answer.json()["detail"]
        assert "Retry-After" in answer.headers
    _health_until(server, 200)
    assert requests.get(f"{server}/api/v1/openapi.json", timeout=5).status_code == 200
