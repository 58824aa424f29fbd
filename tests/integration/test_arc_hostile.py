"""The ARC REST client against a CE that misbehaves on purpose (a real HTTPS server on
loopback, written here): answers trickled a byte at a time, huge answers, gzip bombs,
redirects to another origin, malformed values. Each is that CE's ArcError, within the
client's deadline, and never reads more than the client's cap."""

from __future__ import annotations

import gzip
import socket

import pytest

from agents.ce.arc import OUTPUT_FETCHES, ArcCE
from agents.ce.arcrest import ArcRefused, ArcRestClient, ArcUnavailable, ArcUnreachable
from agents.ce.base import CEPilot, CEUnavailable, PilotSpec
from agents.ce.config import CEConfig
from taskqueue.pilots.records import storable
from tests.helpers import write_token_file
from tests.integration.hostile_ce import Lab, Reply, arex, lab, reply

__all__ = ["lab"]  # the fixture, used by name


# -- one deadline for the whole exchange ---------------------------------------------------


def test_a_trickled_answer_ends_at_the_clients_deadline(lab: Lab) -> None:
    body = b'{"job": {"id": "a", "status-code": "201", "state": "RUNNING"}}' + b" " * 200
    trickled = Reply(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n", body,
                     "trickle")
    client = lab.client(lab.ce(arex(lambda method, path: trickled)), timeout=1.0)
    with pytest.raises(ArcUnreachable, match="no complete answer within 1 s"):
        client.statuses(["a"])


# -- bounded answers -------------------------------------------------------------------------


def test_a_huge_answer_is_not_read_past_the_cap(lab: Lab) -> None:
    flood = Reply(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\n\r\n", b" " * 65536, "flood")
    client = lab.client(lab.ce(arex(lambda method, path: flood)), timeout=30)
    with pytest.raises(ArcUnavailable, match="larger than 16777216 bytes"):
        client.statuses(["a"])


def test_a_gzip_bomb_is_not_decoded_past_the_cap(lab: Lab) -> None:
    bomb = gzip.compress(b" " * 64_000_000, compresslevel=9)
    assert len(bomb) < 200_000
    answer = reply(bomb, status="201 Created", extra="Content-Encoding: gzip\r\n")
    client = lab.client(lab.ce(arex(lambda method, path: answer)), timeout=30)
    with pytest.raises(ArcUnavailable, match="larger than 16777216 bytes"):
        client.statuses(["a"])


# -- redirects stay at the CE ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["other host", "plain http"])
def test_a_redirect_away_from_the_ce_is_not_followed(lab: Lab, where: str) -> None:
    elsewhere = lab.ce(lambda method, path: reply(
        b'{"job": {"id": "a", "status-code": "201", "state": "FINISHED"}}',
        status="201 Created"), tls=where == "other host")
    moved = Reply(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {elsewhere.url}/x\r\n"
                  "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
    client = lab.client(lab.ce(arex(lambda method, path: moved)))
    with pytest.raises(ArcRefused, match="away from the CE"):
        client.kill(["a"])
    assert elsewhere.requests == []


# -- malformed values are the CE's error ----------------------------------------------------


def test_a_listing_with_a_size_that_is_no_number_is_the_ces_error(lab: Lab) -> None:
    listing = (b'<?xml version="1.0"?><ListFilesResponse><file size="abc">pilot.out</file>'
               b"</ListFilesResponse>")
    client = lab.client(lab.ce(arex(lambda method, path: reply(listing))))
    with pytest.raises(ArcUnavailable, match="size 'abc', not a number"):
        client.session_files("a")


def test_a_content_range_that_is_no_size_is_the_ces_error(lab: Lab) -> None:
    client = lab.client(lab.ce(arex(lambda method, path: reply(
        b"x", status="206 Partial Content", extra="Content-Range: bytes 0-0/abc\r\n"))))
    with pytest.raises(ArcUnavailable, match="Content-Range 'bytes 0-0/abc'"):
        client.download("a", "pilot.out")


def test_an_exit_code_that_is_no_number_is_the_ces_error(lab: Lab) -> None:
    record = (b'{"job": {"id": "a", "status-code": "200", "info_document": {"ComputingActivity":'
              b' {"State": ["arcrest:FINISHED"], "ExitCode": "zero"}}}}')
    client = lab.client(lab.ce(arex(lambda method, path: reply(record, status="201 Created"))))
    with pytest.raises(ArcUnavailable, match="exit code 'zero', not a number"):
        client.infos(["a"])


# -- a CE that stops answering costs one deadline, not one per pilot -------------------------


def test_a_ce_that_stops_answering_mid_submission_is_waited_for_once(lab: Lab) -> None:
    created = b'{"job": [' + b", ".join(
        b'{"id": "j%d", "status-code": "201", "reason": "Created"}' % i for i in range(3)
    ) + b"]}"
    silence = Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b" " * 10, "trickle")

    def jobs(method: str, path: str) -> Reply:
        if method == "POST" and "action=new" in path:
            return reply(created, status="201 Created")
        if method == "PUT":
            return silence
        return reply(b"", status="500 Internal Server Error")  # clean, kill: broken too

    server = lab.ce(arex(jobs))
    token = write_token_file(lab.tmp / "token", "a.b.c")
    ce = ArcCE(CEConfig("arc", "arc", endpoint=server.url + "/arex", token_file=str(token),
                        ca_bundle=str(lab.ca)), timeout=1)
    specs = [PilotSpec(f"p{i}", "gridpilot-pilot", [], {}, token=f"t{i}") for i in range(3)]
    results = ce.submit(specs)
    assert [type(r) for r in results] == [CEUnavailable] * 3
    assert "no complete answer within 1 s" in str(results[0])
    # One upload waited for its deadline; the other pilots were not sent to the silent CE.
    assert sum(r.startswith("PUT ") for r in server.requests) == 1


# -- the innermost reason first ------------------------------------------------------------


def test_a_ce_that_refuses_the_connection_says_so_first(lab: Lab) -> None:
    """Issue 34 item 7: "Connection refused" leads the message, and survives being stored."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    token = write_token_file(lab.tmp / "token", "a.b.c")
    client = ArcRestClient(f"https://127.0.0.1:{port}/arex", token_file=token,
                           ca_bundle=lab.ca, timeout=5)
    with pytest.raises(ArcUnreachable) as raised:
        client.statuses(["a"])
    message = str(raised.value)
    assert message.startswith(f"127.0.0.1:{port}: [Errno 111] Connection refused; no answer "
                              f"from https://127.0.0.1:{port}/arex ("), message
    assert "object at 0x" not in message.split(";")[0]
    # What the pilots loop stores for the CE's queues (the poll's error, 255 characters).
    stored = storable(f"arc:https://127.0.0.1:{port}/arex: {message}")
    assert "Connection refused" in stored


def test_a_ce_that_stops_answering_while_outputs_are_fetched_is_waited_for_once(
        lab: Lab) -> None:
    silence = Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", b" " * 10, "trickle")
    server = lab.ce(arex(lambda method, path: silence))
    token = write_token_file(lab.tmp / "token", "a.b.c")
    ce = ArcCE(CEConfig("arc", "arc", endpoint=server.url + "/arex", token_file=str(token),
                        ca_bundle=str(lab.ca)), timeout=1)
    pilots = [CEPilot(f"p{i}", f"j{i}") for i in range(5 * OUTPUT_FETCHES)]
    outputs = ce.outputs(pilots, 1024)
    assert [type(outputs[p.reference]) for p in pilots] == [CEUnavailable] * len(pilots)
    # The fetches under way when the CE fell silent waited for their deadline together; the
    # other pilots were not asked for.
    assert sum("/session/" in r for r in server.requests) <= OUTPUT_FETCHES
