"""``gridpilot-client``: every command against a real matcher (``gridpilot serve`` on loopback,
SQLite), with a user's token; pilots are played over HTTP with a pilot token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from click.testing import CliRunner, Result

from client.cli import EXIT_NOT_DONE, EXIT_NOT_FOUND, EXIT_PARTIAL, EXIT_TIMEOUT, cli
from gridpilot import schema
from gridpilot.devserver import free_port, matcher_server
from pilot.archive import Member, pack
from pilot.client import MatcherClient
from pilot.protocol import PEEK_CHARS
from pilot.sandbox import Outputs
from pilot.sandbox import upload as upload_output
from taskqueue.db.database import make_engine
from taskqueue.tokens import issue_token

ROOT = Path(__file__).resolve().parents[2]
SECRET = "client-tests-signing-secret-0123456789"
CERN = {"site": "LCG.CERN.cern", "ce": "ce503.cern.ch", "queue": "condor"}


@dataclass(frozen=True)
class Server:
    url: str

    def token(self, subject: str = "alice", role: str = "user", **kw: Any) -> str:
        kw.setdefault("group", "lhcb_admin" if role == "operator" else
                      "lhcb_pilot" if role == "pilot" else "lhcb_user")
        return issue_token(SECRET, subject=subject, role=role, vo=kw.pop("vo", "lhcb"),
                           lifetime=3600, **kw)

    def pilot(self, *path_and_body: Any) -> Any:
        """A pilot's call (a token for the pilot reference p-1)."""
        method, path, body = path_and_body
        response = requests.request(method, f"{self.url}/api/v1{path}", json=body, timeout=30,
                                    headers={"Authorization": "Bearer " + self.token(
                                        "factory", "pilot", pilot="p-1")})
        assert response.status_code == 200, response.text
        return response.json()

    def run_job(self, tag: str, exit_code: int = 0, tail: str = "hello\n",
                outputs: list[Member] | None = None) -> int:
        """A pilot that runs only jobs tagged ``tag`` takes one, runs it and reports it
        ended (with ``outputs`` uploaded as its output sandbox, by the pilot's own code)."""
        jobs = self.pilot("POST", "/pilots/match", {"resource": {
            "vo": "lhcb", "pilot_reference": "p-1", "tags": [tag], "required_tags": [tag],
            **CERN}})["jobs"]
        job_id = int(jobs[0]["job_id"])
        self.pilot("POST", f"/pilots/jobs/{job_id}/status",
                   {"pilot_reference": "p-1", "status": "Running"})
        report: dict[str, Any] = {
            "pilot_reference": "p-1", "status": "Done" if exit_code == 0 else "Failed",
            "exit_code": exit_code, "output_tail": tail, "cpu_used": 1.5}
        if outputs is not None:
            client = MatcherClient(self.url, self.token("factory", "pilot", pilot="p-1"))
            report["output_sandbox"] = upload_output(client, Outputs(job_id, pack(outputs)),
                                                     "p-1")
            client.http.close()
        self.pilot("POST", f"/pilots/jobs/{job_id}/status", report)
        return job_id


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("client-matcher")
    url = f"sqlite:///{work / 'gridpilot.db'}"
    engine = make_engine(url)
    schema.upgrade(engine)
    engine.dispose()
    with matcher_server(url, SECRET, ROOT / "conf" / "resources.toml", work,
                        workers=1) as base:
        yield Server(base)


@pytest.fixture()
def gp(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Runs the client as alice (or with the token given), in an empty config folder."""
    for name in list(os.environ):
        if name.startswith(("GRIDPILOT_", "BEARER_TOKEN")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.chdir(tmp_path)

    def run(*args: str, token: str | None = None, url: str | None = None,
            stdin: str | None = None) -> Result:
        prefix = ["--url", url or server.url, "--token", token or server.token()]
        return CliRunner().invoke(cli, [*prefix, *args], input=stdin, catch_exceptions=False)

    return run


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text, encoding="utf-8")
    return str(tmp_path / name)


def submitted(result: Result) -> list[int]:
    assert result.exit_code == 0, result.output
    # The service's warnings are written to stderr, which the runner mixes in.
    return [int(line.split()[0]) for line in result.output.splitlines()
            if ": warning: " not in line]


def test_submit_jdl_and_json_files(gp: Any, tmp_path: Path) -> None:
    jdl = write(tmp_path, "a.jdl", '[ Executable = "/bin/echo"; JobName = "a-%n"; '
                                   'JobGroup = "t-submit"; Parameters = 2; ]')
    spec = write(tmp_path, "b.json", json.dumps({
        "executable": "/bin/echo", "name": "b",
        "attributes": {"custom_attributes": {"JobGroup": "t-submit"}}}))
    ids = submitted(gp("submit", jdl, spec))
    assert len(ids) == 3 and ids == sorted(ids)
    answer = json.loads(gp("list", "--group", "t-submit", "--json").output)
    assert sorted(j["job_id"] for j in answer["jobs"]) == ids
    assert {j["job_name"] for j in answer["jobs"]} == {"a-0", "a-1", "b"}
    as_json = gp("submit", "--json", spec)
    assert json.loads(as_json.output)["jobs"][0]["status"] == "Waiting"


def test_submit_shows_warnings_for_unknown_attributes(gp: Any, tmp_path: Path) -> None:
    jdl = write(tmp_path, "typo.jdl", '[ Executable = "/bin/true"; NumberOfProcesors = 2; ]')
    result = gp("submit", jdl)
    assert result.exit_code == 0, result.output
    assert "typo.jdl: warning: " in result.stderr
    assert "did you mean NumberOfProcessors?" in result.stderr
    assert result.stdout.strip().isdigit()


def test_a_refused_file_shows_the_services_detail(gp: Any, tmp_path: Path) -> None:
    good = write(tmp_path, "good.jdl", 'Executable = "x"; JobGroup = "t-refused";')
    bad = write(tmp_path, "bad.jdl", 'Executable = "x"; Priority = "high";')
    result = gp("submit", good, bad)
    assert result.exit_code == 1
    assert f'{bad}: Priority must be an integer from 0 to 10, got "high"' in result.output
    assert "Traceback" not in result.output
    # the good file's job went in first and is printed
    assert len(result.output.splitlines()) == 2
    unreadable = gp("submit", str(tmp_path / "missing.jdl"))
    assert unreadable.exit_code == 2 and "does not exist" in unreadable.output
    unmeetable = write(tmp_path, "legacy.jdl",
                       'Executable = "x"; Requirements = [ SoftwareTag = "nope-v0" ];')
    failed = gp("submit", unmeetable)
    assert failed.exit_code == EXIT_PARTIAL and "Failed: Requirements" in failed.output


def test_status_and_list(gp: Any, server: Server, tmp_path: Path) -> None:
    ids = submitted(gp("submit", write(tmp_path, "j.jdl", 'Executable = "x"; '
                                       'JobName = "scan_%n"; JobGroup = "t-list"; '
                                       'Parameters = 3;')))
    shown = gp("status", *map(str, ids))
    assert shown.exit_code == 0 and shown.output.count("Waiting") == 3
    assert "scan_1" in shown.output and "t-list" in shown.output
    mixed = gp("status", str(ids[0]), "999999", "--json")
    assert mixed.exit_code == EXIT_NOT_FOUND
    assert json.loads(mixed.stdout)["errors"][0]["detail"] == "job 999999 does not exist"
    # another user's job is not shown to alice
    assert gp("status", str(ids[0]), token=server.token("bob")).exit_code == EXIT_PARTIAL

    listed = json.loads(gp("list", "--group", "t-list", "--name", "scan_*", "--since", "1h",
                           "--json").output)["jobs"]
    assert [j["job_id"] for j in listed] == sorted(ids, reverse=True)
    oldest = gp("list", "--group", "t-list", "--oldest-first", "--limit", "2")
    assert oldest.output.index("scan_0") < oldest.output.index("scan_1")
    assert "scan_2" not in oldest.output and "--limit or --all" in oldest.output
    summary = gp("list", "--group", "t-list", "--summary", "--json")
    assert json.loads(summary.output) == {"total": 3, "by_status": {"Waiting": 3}}
    assert "total" in gp("list", "--group", "t-list", "--summary").output
    bad = gp("list", "--since", "last tuesday")
    assert bad.exit_code == 1 and "ISO 8601" in bad.output
    everything = json.loads(gp("list", "--all", "--json").output)["jobs"]
    operator = json.loads(gp("list", "--all", "--json",
                             token=server.token("olga", "operator")).output)["jobs"]
    assert len(operator) >= len(everything) >= 3


def test_kill_reschedule_delete_many(gp: Any, server: Server, tmp_path: Path) -> None:
    ids = submitted(gp("submit", write(tmp_path, "k.jdl", 'Executable = "x"; '
                                       'JobGroup = "t-kill"; Parameters = 4;')))
    theirs = submitted(gp("submit", write(tmp_path, "b.jdl", 'Executable = "x";'),
                          token=server.token("bob")))
    killed = gp("kill", str(ids[0]), str(ids[1]), str(theirs[0]), "--reason", "typo")
    assert killed.exit_code == EXIT_PARTIAL
    assert f"{ids[0]}: Killed" in killed.output and f"{ids[1]}: Killed" in killed.output
    assert f"{theirs[0]}: not killed: job {theirs[0]} belongs to another user" \
        in killed.output
    # ids from standard input
    again = gp("reschedule", "-", stdin=f"{ids[0]}\n{ids[1]}\n")
    assert again.exit_code == 0 and again.output.count("Waiting") == 2
    deleted = json.loads(gp("delete", *map(str, ids), "--json").output)
    assert [j["status"] for j in deleted["jobs"]] == ["Deleted"] * 4
    assert gp("kill", "abc").exit_code == 2
    # A job that does not exist is an error of its own, not "done for some jobs only".
    nothing = gp("kill", "999999998", "999999999")
    assert nothing.exit_code == EXIT_NOT_FOUND, nothing.output
    assert "no such job: 999999998, 999999999" in nothing.output
    some = gp("kill", str(ids[2]), "999999999")
    assert some.exit_code == EXIT_NOT_FOUND and "no such job: 999999999" in some.output
    assert gp("output", "999999999").exit_code == EXIT_NOT_FOUND
    assert gp("kill", "0").exit_code == 2


def test_wait_output_log_explain(gp: Any, server: Server, tmp_path: Path) -> None:
    ok, bad = submitted(gp("submit", write(tmp_path, "w.jdl", 'Executable = "x"; '
                                           'Tags = "t-wait"; Parameters = 2;')))
    done_id = server.run_job("t-wait", 0, "all good\n")
    failed_id = server.run_job("t-wait", 3, "oops\n")
    assert {done_id, failed_id} == {ok, bad}
    waited = gp("wait", str(done_id), "--interval", "0.2")
    assert waited.exit_code == 0 and "Done" in waited.output
    assert gp("wait", str(done_id), str(failed_id), "--interval", "0.2").exit_code == \
        EXIT_NOT_DONE

    out = gp("output", str(done_id), "-d", str(tmp_path / "out"))
    assert out.exit_code == 0 and "exit code 0" in out.output
    assert (tmp_path / "out" / "output.txt").read_text() == "all good\n"

    log = gp("log", str(failed_id))
    assert log.exit_code == 0
    for fragment in ("Received", "Matched", "Running", "Failed", "pilot", "p-1",
                     "exit code", "3", "CPU used (s)", "1.5", "LCG.CERN.cern"):
        assert fragment in log.output, fragment

    waiting = submitted(gp("submit", write(tmp_path, "g.jdl", 'Executable = "x"; '
                                           'Tags = {"GPU"};')))[0]
    assert gp("wait", str(waiting), "--timeout", "0.5", "--interval", "0.2").exit_code == \
        EXIT_TIMEOUT
    can = gp("explain", str(waiting), "--queue", "LCG.RAL.uk/arc-ce01.gridpp.rl.ac.uk/gpu")
    assert can.exit_code == 0 and "=> it can run there" in can.output
    cannot = gp("explain", str(waiting), "--queue", "LCG.CERN.cern/ce503.cern.ch/condor")
    assert cannot.exit_code == EXIT_NOT_DONE and "[NO] tags" in cannot.output
    node = write(tmp_path, "node.json", json.dumps({"vo": "lhcb", "tags": ["GPU"]}))
    assert gp("explain", str(waiting), "--resource", node).exit_code == 0
    assert gp("explain", str(waiting), "--resource", node, "--queue", "a/b/c").exit_code == 2
    everywhere = gp("explain", str(waiting))
    assert everywhere.exit_code == 0, everywhere.output
    assert "[ok] LCG.RAL.uk/arc-ce01.gridpp.rl.ac.uk/gpu" in everywhere.output.splitlines()
    assert "[NO] LCG.CERN.cern/ce503.cern.ch/condor: tags:" in everywhere.output


def test_output_fetches_the_output_sandbox_files(gp: Any, server: Server,
                                                 tmp_path: Path) -> None:
    (job_id,) = submitted(gp("submit", write(tmp_path, "o.jdl", 'Executable = "x"; '
                                             'Tags = "t-out"; OutputSandbox = {"r.txt"};')))
    assert server.run_job("t-out", 0, "tail\n", outputs=[
        Member("r.txt", b"result\n"), Member("std.out", b"the whole output\n")]) == job_id
    out = gp("output", str(job_id), "-d", str(tmp_path / "all"))
    assert out.exit_code == 0, out.output
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == [
        "output.txt", "r.txt", "std.out"]
    assert (tmp_path / "all" / "r.txt").read_bytes() == b"result\n"
    assert str(tmp_path / "all" / "r.txt") in out.output
    # Only the tail when asked; and a folder that has the files already is refused, named.
    tail_only = gp("output", str(job_id), "-d", str(tmp_path / "tail"), "--no-sandbox")
    assert tail_only.exit_code == 0
    assert [p.name for p in (tmp_path / "tail").iterdir()] == ["output.txt"]
    again = gp("output", str(job_id), "-d", str(tmp_path / "all"))
    assert again.exit_code == 2
    assert "cannot be unpacked into" in again.output and "--no-sandbox" in again.output
    assert "Traceback" not in again.output


def test_whoami(gp: Any, server: Server) -> None:
    me = json.loads(gp("whoami", "--json").output)
    assert (me["subject"], me["role"], me["vo"], me["group"], me["issuer"]) == (
        "alice", "user", "lhcb", "lhcb_user", "gridpilot")
    assert me["expires_at"].endswith("Z")
    assert "alice" in gp("whoami").output


def test_config_file_environment_and_errors(server: Server, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("GRIDPILOT_", "BEARER_TOKEN")):
            monkeypatch.delenv(name)
    config = tmp_path / "config" / "gridpilot"
    config.mkdir(parents=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.chdir(tmp_path)  # the token file's path counts from the config's folder
    runner = CliRunner()

    missing = runner.invoke(cli, ["whoami"])
    assert missing.exit_code == 2 and "no service URL" in missing.output

    (config / "client.toml").write_text(f'url = "{server.url}"\ntoken_file = "token"\n')
    no_token = runner.invoke(cli, ["whoami"])
    assert no_token.exit_code == 2 and "cannot read the token file" in no_token.output
    (config / "token").write_text(server.token("carol") + "\n")
    assert json.loads(runner.invoke(cli, ["whoami", "--json"]).output)["subject"] == "carol"

    # the environment wins over the file; the WLCG variables come after both
    monkeypatch.setenv("GRIDPILOT_TOKEN", server.token("dave"))
    assert json.loads(runner.invoke(cli, ["whoami", "--json"]).output)["subject"] == "dave"
    monkeypatch.delenv("GRIDPILOT_TOKEN")
    (config / "client.toml").write_text(f'url = "{server.url}"\n')
    monkeypatch.setenv("BEARER_TOKEN", server.token("erin"))
    assert json.loads(runner.invoke(cli, ["whoami", "--json"]).output)["subject"] == "erin"
    monkeypatch.delenv("BEARER_TOKEN")
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / f"bt_u{os.getuid()}").write_text(server.token("frank"))
    assert json.loads(runner.invoke(cli, ["whoami", "--json"]).output)["subject"] == "frank"

    bad = runner.invoke(cli, ["--token", "not-a-jwt", "whoami"])
    assert bad.exit_code == 1 and "the token is not valid" in bad.output
    down = runner.invoke(cli, ["--url", f"http://127.0.0.1:{free_port()}", "whoami"])
    assert down.exit_code == 3 and "cannot reach" in down.output
    (config / "client.toml").write_text('url = "x"\ncolour = "blue"\n')
    assert "unknown key 'colour'" in runner.invoke(cli, ["whoami"]).output


def test_the_installed_command(server: Server, tmp_path: Path) -> None:
    """The console script, as a user runs it: help with the exit codes, and a real call."""
    command = Path(sys.executable).with_name("gridpilot-client")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRIDPILOT_")}
    env.update(GRIDPILOT_URL=server.url, GRIDPILOT_TOKEN=server.token(),
               XDG_CONFIG_HOME=str(tmp_path))
    shown = subprocess.run([str(command), "--help"], capture_output=True, text=True,
                           env=env, timeout=60)
    assert shown.returncode == 0 and "Exit codes:" in shown.stdout
    started = time.monotonic()
    me = subprocess.run([str(command), "whoami"], capture_output=True, text=True, env=env,
                        timeout=60)
    assert me.returncode == 0 and "alice" in me.stdout, me.stderr
    assert time.monotonic() - started < 60


def test_peek_shows_no_terminal_escapes_but_raw_keeps_them(gp: Any, server: Server,
                                                           tmp_path: Path) -> None:
    (job_id,) = submitted(gp("submit", write(tmp_path, "e.jdl", 'Executable = "x"; '
                                             'Tags = "t-escape";')))
    jobs = server.pilot("POST", "/pilots/match", {"resource": {
        "vo": "lhcb", "pilot_reference": "p-1", "tags": ["t-escape"],
        "required_tags": ["t-escape"], **CERN}})["jobs"]
    assert int(jobs[0]["job_id"]) == job_id
    server.pilot("POST", f"/pilots/jobs/{job_id}/status",
                 {"pilot_reference": "p-1", "status": "Running"})
    tail = ("event 1\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;title\x07\x1b[2J\x1b[8mhidden\x1b[0m"
            "\x9b2J\u202eevil\r\nevent\t2\n")
    server.pilot("POST", "/pilots/heartbeat", {"pilot_reference": "p-1", "jobs": [
        {"job_id": job_id, "cpu_used": 1.0, "output_tail": tail}]})
    peeked = gp("peek", str(job_id))
    assert peeked.exit_code == 0
    shown = peeked.output.split("\n", 1)[1]
    assert shown == ("event 1]52;c;cm0gLXJmIH4=]0;title[2J[8mhidden[0m2Jevil\n"
                     "event\t2\n"), repr(shown)
    raw = gp("peek", "--raw", str(job_id))
    # (Result.output would turn CR LF into LF.)
    assert raw.stdout_bytes.decode().split("\n", 1)[1] == tail, repr(raw.stdout_bytes)
    as_json = gp("peek", "--json", str(job_id))
    assert json.loads(as_json.output)["output_tail"] == tail
    assert "\x1b" not in as_json.output

def test_peek_shows_the_tail_a_running_job_sent_with_its_heartbeat(
        gp: Any, server: Server, tmp_path: Path) -> None:
    (job_id,) = submitted(gp("submit", write(tmp_path, "p.jdl", 'Executable = "x"; '
                                             'Tags = "t-peek";')))
    jobs = server.pilot("POST", "/pilots/match", {"resource": {
        "vo": "lhcb", "pilot_reference": "p-1", "tags": ["t-peek"], "required_tags": ["t-peek"],
        **CERN}})["jobs"]
    assert int(jobs[0]["job_id"]) == job_id
    server.pilot("POST", f"/pilots/jobs/{job_id}/status",
                 {"pilot_reference": "p-1", "status": "Running"})
    nothing = gp("peek", str(job_id)).output.strip()
    assert nothing.startswith(f"job {job_id} (Running)") and nothing.endswith(": no output yet")
    server.pilot("POST", "/pilots/heartbeat", {"pilot_reference": "p-1", "jobs": [
        {"job_id": job_id, "cpu_used": 3.0, "output_tail": "event 1\nevent 2\n"}]})
    peeked = gp("peek", str(job_id))
    assert peeked.exit_code == 0
    head, *tail = peeked.output.splitlines()
    assert head.startswith(f"job {job_id} (Running), as of its pilot's heartbeat at ")
    assert tail == ["event 1", "event 2"]
    # A tail over the bound is refused whole, and the last one is kept.
    too_long = requests.post(
        f"{server.url}/api/v1/pilots/heartbeat", timeout=30,
        json={"pilot_reference": "p-1", "jobs": [
            {"job_id": job_id, "output_tail": "x" * (PEEK_CHARS + 1)}]},
        headers={"Authorization": "Bearer " + server.token("factory", "pilot", pilot="p-1")})
    assert too_long.status_code == 422 and "output_tail" in too_long.text
    assert gp("peek", str(job_id)).output.splitlines()[1:] == ["event 1", "event 2"]

