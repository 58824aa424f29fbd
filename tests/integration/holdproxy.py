"""A reverse proxy on loopback that forwards each request to a real matcher, except that it
holds the requests a test names until the test lets them go: how a test delays one of a
pilot's calls (a report stuck in a slow network) while everything else flows."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

#: Headers that belong to one hop, not forwarded.
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host",
       "content-encoding"}

Hold = Callable[[str, str, bytes], bool]


@dataclass
class Holding:
    """Which requests to hold (method, path, body → True), those held so far, and the
    event that releases them."""

    hold: Hold
    release: threading.Event = field(default_factory=threading.Event)
    held: list[tuple[str, str]] = field(default_factory=list)
    arrived: threading.Event = field(default_factory=threading.Event)


@contextmanager
def holding_proxy(target: str, hold: Hold) -> Iterator[tuple[str, Holding]]:
    """Yield the proxy's base URL and its :class:`Holding`; held requests are released and
    the proxy stopped on the way out."""
    state = Holding(hold)
    upstream = requests.Session()
    upstream.trust_env = False

    class Handler(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not state.release.is_set() and state.hold(self.command, self.path, body):
                state.held.append((self.command, self.path))
                state.arrived.set()
                state.release.wait(timeout=120)
            answer = upstream.request(
                self.command, target + self.path, data=body, timeout=60,
                headers={k: v for k, v in self.headers.items() if k.lower() not in HOP})
            self.send_response(answer.status_code)
            for key, value in answer.headers.items():
                if key.lower() not in HOP:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()
        thread.join()
        upstream.close()
