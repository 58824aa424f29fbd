"""``gridpilot-client submit`` packs and uploads the local files of an InputSandbox (checksum
first: bytes the service has are not sent again) against a real matcher on loopback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests

from client.sandboxes import fetch_output, upload, with_uploaded_inputs
from client.service import Service
from pilot.archive import Member, is_sandbox_id, pack
from tests.integration import test_client
from tests.integration.test_client import Server, submitted, write

#: The client tests' fixtures: a matcher on loopback, and the client run as a user.
server = test_client.server
gp = test_client.gp


class CountingSession(requests.Session):
    """A real session that also counts the uploads it sends."""

    puts = 0

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any
                ) -> requests.Response:
        if method == "PUT":
            CountingSession.puts += 1
        return super().request(method, url, *args, **kwargs)


def test_submit_uploads_the_local_files_once_for_a_parametric_job(
        gp: Any, server: Server, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("input data\n")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "a.conf").write_text("x=1\n")
    # The LFN: entry is input data (as in DIRAC): the job waits only where it has a replica.
    registered = requests.post(
        f"{server.url}/api/v1/replicas", timeout=30,
        json={"replicas": [{"lfn": "/lhcb/f.dst", "se": "CERN-DST"}]},
        headers={"Authorization": "Bearer " + server.token("olga", "operator")})
    assert registered.status_code == 200, registered.text
    jdl = write(tmp_path, "job.jdl", '[ Executable = "/bin/cat"; Arguments = "data.txt"; '
                                     'InputSandbox = {"data.txt", "cfg", "LFN:/lhcb/f.dst"}; '
                                     'Parameters = 2; JobGroup = "t-sandbox"; ]')
    ids = submitted(gp("submit", jdl))
    assert len(ids) == 2
    service = Service(server.url, server.token())
    outputs = [service.output(i) for i in ids]
    (sid,) = outputs[0]["input_sandboxes"]
    assert is_sandbox_id(sid) and outputs[1]["input_sandboxes"] == [sid]
    names = fetch_output(service, sid, tmp_path / "back")
    assert sorted(names) == ["cfg/a.conf", "data.txt"]
    assert (tmp_path / "back" / "data.txt").read_text() == "input data\n"
    job = service.job(ids[0])
    assert job["status"] == "Waiting"


def test_a_missing_local_file_is_named_and_nothing_is_submitted(gp: Any,
                                                                tmp_path: Path) -> None:
    jdl = write(tmp_path, "job.jdl", '[ Executable = "/bin/cat"; '
                                     'InputSandbox = {"nowhere.txt"}; JobGroup = "t-none"; ]')
    result = gp("submit", jdl)
    assert result.exit_code == 2
    assert "nowhere.txt cannot be read" in result.output and "Traceback" not in result.output
    listed = json.loads(gp("list", "--group", "t-none", "--json").output)
    assert listed["jobs"] == []


def test_bytes_the_service_has_are_not_sent_again(server: Server) -> None:
    service = Service(server.url, server.token("carol"), session=CountingSession())
    data = pack([Member("same.txt", b"same bytes")])
    before = CountingSession.puts
    first = upload(service, data)
    second = upload(service, data)
    assert first == second and CountingSession.puts == before + 1


def test_json_descriptions_get_the_sandbox_id_too(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("1")
    stored: list[bytes] = []

    def store(data: bytes) -> str:
        stored.append(data)
        return "sb:sha256:" + "0" * 64

    text = json.dumps([{"executable": "x", "input_sandbox": ["in.txt", "LFN:/a"]},
                       {"executable": "y", "input_sandbox": ["in.txt"]}])
    out = json.loads(with_uploaded_inputs(text, "json", tmp_path, store))
    assert len(stored) == 1
    assert out[0]["input_sandbox"] == ["LFN:/a", "sb:sha256:" + "0" * 64]
    assert out[1]["input_sandbox"] == ["sb:sha256:" + "0" * 64]
    # A JDL without local files is sent unchanged.
    plain = '[Executable = "x"; InputSandbox = {"LFN:/a"}]'
    assert with_uploaded_inputs(plain, "jdl", tmp_path, store) == plain
