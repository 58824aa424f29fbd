"""Machine/job features over HTTP from a real ``http.server`` on loopback: values, 404,
errors, and the cache rules (counted as requests on the server)."""

from __future__ import annotations

import collections
import email.utils
import functools
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from pilot import features as features_module
from pilot.features import Features, JobFeatures, MachineFeatures, write_features
from tests.unit.test_features import JOB, MACHINE, Clock, records


@dataclass
class Control:
    """What the test server answers, and what it was asked."""

    headers: dict[str, dict[str, str]] = field(default_factory=dict)   # path -> extra headers
    status: dict[str, int] = field(default_factory=dict)               # path -> forced status
    hits: collections.Counter[str] = field(default_factory=collections.Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Handler(SimpleHTTPRequestHandler):
    control: Control

    def do_GET(self) -> None:
        with self.control.lock:
            self.control.hits[self.path] += 1
            forced = self.control.status.get(self.path)
        if forced is not None:
            self.send_response(forced)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    def end_headers(self) -> None:
        with self.control.lock:
            extra = dict(self.control.headers.get(self.path, {}))
        for name, value in extra.items():
            self.send_header(name, value)
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Server:
    root: Path
    url: str
    control: Control


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    control = Control()
    handler = type("BoundHandler", (Handler,), {"control": control})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler,
                                                                    directory=str(tmp_path)))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield Server(tmp_path, f"http://127.0.0.1:{httpd.server_address[1]}", control)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        s.trust_env = False  # loopback: never through a proxy from the environment
        yield s


def features(server: Server, session: requests.Session, clock: Clock) -> Features:
    return Features(f"{server.url}/machine/", f"{server.url}/job", session=session, clock=clock)


def test_all_keys_over_http(server: Server, session: requests.Session,
                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pilot.features")
    write_features(server.root / "machine", MACHINE)
    write_features(server.root / "job", JOB)
    f = features(server, session, Clock())
    assert f.machine() == MachineFeatures(**MACHINE)  # type: ignore[arg-type]
    assert f.job() == JobFeatures(**JOB)  # type: ignore[arg-type]
    limits = f.limits(1_700_001_000.0, cpu_used=600.0)
    assert (limits.wall_end, limits.cpu_left, limits.shutdown) == (
        1_700_007_200.0, 354_000.0, 1_700_005_000.0)
    assert set(server.control.hits) == ({f"/machine/{k}" for k in MACHINE}
                                        | {f"/job/{k}" for k in JOB})
    assert records(caplog) == []


def test_static_keys_are_fetched_once_whatever_the_headers(server: Server,
                                                           session: requests.Session) -> None:
    write_features(server.root / "machine", {"hs06": 100, "jobslots": 8})
    server.control.headers["/machine/hs06"] = {"Cache-Control": "no-store"}
    clock = Clock()
    f = features(server, session, clock)
    for _ in range(3):
        assert f.machine().hs06 == 100.0
        clock.now += 3_600
    hits = server.control.hits
    assert hits["/machine/hs06"] == 1 and hits["/machine/jobslots"] == 1
    assert hits["/machine/shutdowntime"] == 3      # the dynamic key: every check (no headers)


def test_max_age_keeps_shutdowntime_until_it_expires(server: Server,
                                                     session: requests.Session) -> None:
    write_features(server.root / "machine", {"shutdowntime": 5_000})
    server.control.headers["/machine/shutdowntime"] = {"Cache-Control": "public, max-age=60"}
    clock = Clock(1_000.0)
    f = features(server, session, clock)
    assert f.machine().shutdowntime == 5_000
    write_features(server.root / "machine", {"shutdowntime": 4_000})
    clock.now += 30
    assert f.machine().shutdowntime == 5_000        # still fresh: not fetched again
    assert server.control.hits["/machine/shutdowntime"] == 1
    clock.now += 31
    assert f.machine().shutdowntime == 4_000        # expired: fetched again
    assert server.control.hits["/machine/shutdowntime"] == 2


def test_age_shortens_max_age(server: Server, session: requests.Session) -> None:
    write_features(server.root / "job", {"shutdowntime_job": 5_000})
    server.control.headers["/job/shutdowntime_job"] = {"Cache-Control": "max-age=60",
                                                       "Age": "50"}
    clock = Clock(1_000.0)
    f = features(server, session, clock)
    f.job()
    clock.now += 5
    f.job()
    assert server.control.hits["/job/shutdowntime_job"] == 1
    clock.now += 6                                  # 11 s > 60 - 50
    f.job()
    assert server.control.hits["/job/shutdowntime_job"] == 2


@pytest.mark.parametrize("cache_control", ["no-cache", "no-store", "max-age=0",
                                           "no-cache, max-age=3600", "max-age=soon"])
def test_uncacheable_shutdowntime_is_fetched_at_every_check(
        server: Server, session: requests.Session, cache_control: str) -> None:
    write_features(server.root / "job", {"shutdowntime_job": 5_000})
    server.control.headers["/job/shutdowntime_job"] = {"Cache-Control": cache_control}
    f = features(server, session, Clock())
    assert f.job().shutdowntime_job == 5_000
    write_features(server.root / "job", {"shutdowntime_job": 4_000})
    assert f.job().shutdowntime_job == 4_000
    assert f.limits().shutdown == 4_000.0
    assert server.control.hits["/job/shutdowntime_job"] == 3


def test_expires_is_honoured(server: Server, session: requests.Session) -> None:
    write_features(server.root / "machine", {"shutdowntime": 5_000})
    expires = email.utils.formatdate(time.time() + 60, usegmt=True)
    server.control.headers["/machine/shutdowntime"] = {"Expires": expires}
    clock = Clock(1_000.0)                          # the server's Date anchors the lifetime
    f = features(server, session, clock)
    f.machine()
    clock.now += 30
    f.machine()
    assert server.control.hits["/machine/shutdowntime"] == 1
    clock.now += 90
    f.machine()
    assert server.control.hits["/machine/shutdowntime"] == 2


def test_an_invalid_expires_means_expired(server: Server, session: requests.Session) -> None:
    write_features(server.root / "machine", {"shutdowntime": 5_000})
    server.control.headers["/machine/shutdowntime"] = {"Expires": "0"}
    f = features(server, session, Clock())
    f.machine()
    f.machine()
    assert server.control.hits["/machine/shutdowntime"] == 2


def test_shutdowntime_appearing_mid_run_over_http(server: Server, session: requests.Session,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pilot.features")
    write_features(server.root / "machine", {"hs06": 10})
    f = features(server, session, Clock())
    assert f.machine().shutdowntime is None         # 404: absent
    assert f.machine().shutdowntime is None
    write_features(server.root / "machine", {"shutdowntime": 7_000})
    assert f.machine().shutdowntime == 7_000
    write_features(server.root / "machine", {"shutdowntime": None})
    assert f.machine().shutdowntime is None         # withdrawn
    absent = records(caplog, "shutdowntime is not provided")
    assert [r.levelno for r in absent] == [logging.INFO]


def test_a_server_error_is_unknown_logged_once_and_retried(
        server: Server, session: requests.Session, caplog: pytest.LogCaptureFixture) -> None:
    write_features(server.root / "machine", {"hs06": 10})
    server.control.status["/machine/hs06"] = 500
    f = features(server, session, Clock())
    assert f.machine().hs06 is None
    assert f.machine().hs06 is None
    assert server.control.hits["/machine/hs06"] == 2     # a passing failure: asked again
    warned = records(caplog, "hs06", logging.WARNING)
    assert len(warned) == 1 and "HTTP 500" in warned[0].getMessage()
    del server.control.status["/machine/hs06"]
    assert f.machine().hs06 == 10.0
    f.machine()
    assert server.control.hits["/machine/hs06"] == 3     # then kept


def test_a_client_error_settles_a_static_key(server: Server, session: requests.Session,
                                             caplog: pytest.LogCaptureFixture) -> None:
    server.control.status["/job/allocated_CPU"] = 403
    f = features(server, session, Clock())
    assert f.job().allocated_CPU is None
    assert f.job().allocated_CPU is None
    assert server.control.hits["/job/allocated_CPU"] == 1
    assert "HTTP 403" in records(caplog, "allocated_CPU", logging.WARNING)[0].getMessage()


def test_an_announced_shutdown_survives_a_server_hiccup(
        server: Server, session: requests.Session, caplog: pytest.LogCaptureFixture) -> None:
    write_features(server.root / "machine", {"shutdowntime": 9_000})
    f = features(server, session, Clock())
    assert f.machine().shutdowntime == 9_000
    server.control.status["/machine/shutdowntime"] = 503
    assert f.machine().shutdowntime == 9_000        # kept, not forgotten
    assert f.machine().shutdowntime == 9_000
    assert len(records(caplog, "HTTP 503", logging.WARNING)) == 1
    server.control.status["/machine/shutdowntime"] = 404
    assert f.machine().shutdowntime is None         # a definite "absent" withdraws it
    assert server.control.hits["/machine/shutdowntime"] == 4


def test_garbage_over_http_is_unknown(server: Server, session: requests.Session,
                                      caplog: pytest.LogCaptureFixture) -> None:
    write_features(server.root / "job", {"cpufactor_lrms": "NaN", "jobstart_secs": b"",
                                         "mem_limit_MB": "-1"})
    f = features(server, session, Clock())
    job = f.job()
    assert (job.cpufactor_lrms, job.jobstart_secs, job.mem_limit_MB) == (None, None, None)
    f.job()
    messages = [r.getMessage() for r in records(caplog, level=logging.WARNING)]
    assert len(messages) == 3
    assert any("not finite" in m for m in messages)
    assert any("empty" in m for m in messages)
    assert any("negative" in m for m in messages)


def test_a_refused_connection_is_unknown(session: requests.Session,
                                         caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as probe:               # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    f = Features(f"http://127.0.0.1:{port}/m", f"http://127.0.0.1:{port}/j", session=session)
    assert f.machine() == MachineFeatures()
    assert f.job() == JobFeatures()
    warned = records(caplog, level=logging.WARNING)
    assert len(warned) == 2 and all("connection failed" in r.getMessage() for r in warned)


def test_an_owned_session_is_closed(server: Server) -> None:
    write_features(server.root / "machine", {"hs06": 10})
    f = Features(f"{server.url}/machine", None)
    try:
        assert f.machine().hs06 == 10.0
    finally:
        f.close()
    f.close()  # twice is harmless


class Trickler:
    """A loopback HTTP server that answers every request a byte at a time, each byte well
    inside the socket timeout, the whole answer well beyond the fetch deadline."""

    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\nConnection: close\r\n\r\n" + \
        b"12" + b" " * 38

    def __init__(self, where: str) -> None:
        self.where = where  # "headers": from the first byte; "body": after the headers
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
            conn.recv(4096)
            head = self.ANSWER.index(b"\r\n\r\n") + 4
            at_once = 0 if self.where == "headers" else head
            try:
                conn.sendall(self.ANSWER[:at_once])
                for i in range(at_once, len(self.ANSWER)):
                    if self.finished.is_set():
                        return
                    conn.sendall(self.ANSWER[i:i + 1])
                    time.sleep(0.1)
            except OSError:
                return

    def close(self) -> None:
        self.finished.set()
        self.listener.close()
        self.thread.join()


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_trickling_server_is_given_up_at_the_fetch_deadline(
        where: str, session: requests.Session, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each byte comes well within the socket timeout; the whole answer would take several
    fetch deadlines. The fetch is given up, so the value is unknown (read to the end, it is
    12), and the source is not asked again for a while."""
    monkeypatch.setattr(features_module, "HTTP_TIMEOUT", 1.0)
    server = Trickler(where)
    try:
        f = Features(None, f"{server.url}/job", session=session)
        assert f.job().allocated_CPU is None
        warned = [r.getMessage() for r in records(caplog, level=logging.WARNING)]
        assert len(warned) == 1 and "no complete answer within 1 s" in warned[0], warned
    finally:
        server.close()
