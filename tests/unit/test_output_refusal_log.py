"""A killed job's output sandbox refused by the matcher is the expected end of it: the pilot
logs it at INFO and the report says nothing more; any other refusal is an ERROR and named in
the report's minor status. Against a real HTTP server on loopback that refuses uploads."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from pilot.client import MatcherClient
from pilot.sandbox import Outputs, attach_output

DETAIL = "job 7 is not a job pilot p-1 holds"


class _Refuses(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"status": 409, "title": "Conflict", "detail": DETAIL}).encode()
        self.send_response(409)
        self.send_header("Content-Type", "application/problem+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture()
def refusing_matcher() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


@pytest.mark.parametrize("killed", [True, False])
def test_a_refusal_after_a_kill_is_logged_at_info(refusing_matcher: str, killed: bool,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    client = MatcherClient(refusing_matcher, "token", timeout=30)
    body: dict[str, Any] = {"status": "Failed", "minor_status": "Payload killed on request"}
    with caplog.at_level(logging.INFO, logger="pilot"):
        assert attach_output(client, Outputs(7, b"x", killed=killed), "p-1", body) is True
    client.http.close()
    refused = [r for r in caplog.records if "Output sandbox refused" in r.getMessage()]
    assert [r.levelname for r in refused] == ["INFO" if killed else "ERROR"]
    assert DETAIL in refused[0].getMessage()
    assert "output_sandbox" not in body
    assert body["minor_status"] == ("Payload killed on request" if killed else
                                    f"Payload killed on request; Output sandbox refused: "
                                    f"{DETAIL}")
